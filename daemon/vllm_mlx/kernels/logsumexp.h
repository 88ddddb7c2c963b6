// log(sum(exp(x))) over the last axis of a float32 array, as MLX's CPU LogSumExp computes
// it on x86-64 Linux (its wheel runs one float at a time): the row's maximum, the
// exponentials exp(x - max) with MLX's exp (act_kernel.h, vectorised here), summed in
// order, then log(sum) + max; a row whose maximum is infinite gives the maximum. The same
// bits as mx.logsumexp(x, axis=-1, keepdims=True), ~10x faster: sampling a 49k-token
// vocabulary normalizes every sampled row every step (engine/batch_generator.py).
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace vllm_mlx_kernels {

namespace mx = mlx::core;

mx::array logsumexp(const mx::array& x, mx::StreamOrDevice s = {});

// One token per row of `logits` (float32 [..., V], scaled by 1 / temperature, -inf where
// masked), drawn with probability softmax(logits) by inverting the cumulative sum at the
// row's `uniform` value in [0, 1) (float32, logits' shape without the last axis): one
// random number per row, where a Gumbel-max draw (mx.random.categorical) needs one per
// vocabulary entry and two logarithms of each. uint32 indices; a row with every entry
// -inf gives 0 (a valid index; the caller's grammar or guard deals with it).
mx::array categorical_draw(const mx::array& logits, const mx::array& uniform,
                           mx::StreamOrDevice s = {});

class FastLogSumExp : public mx::UnaryPrimitive {
 public:
  explicit FastLogSumExp(mx::Stream stream) : mx::UnaryPrimitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "VllmMlxLogSumExp";
  }
  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
};

class FastCategoricalDraw : public mx::UnaryPrimitive {
 public:
  explicit FastCategoricalDraw(mx::Stream stream) : mx::UnaryPrimitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "VllmMlxCategoricalDraw";
  }
  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
};

} // namespace vllm_mlx_kernels
