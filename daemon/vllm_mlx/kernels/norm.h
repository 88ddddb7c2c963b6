// RMS norm and rotary embedding as single graph nodes on the CPU.
//
// On the GPU mx.fast.rms_norm and mx.fast.rope are one kernel each; on the CPU MLX runs
// their fallback graphs (~11 and ~29 nodes: astype, square, sum, rsqrt, broadcasts, arange,
// exp, cos, sin, slices, concatenate...), and at a few microseconds per node that was
// ~4 ms of a ~17 ms single-stream decode step of the bundled model (docs/benchmarks.md).
// Same arithmetic, in float32; the row sums run in another order than MLX's reduction, so
// results agree to float32 rounding, not bit for bit.
#pragma once

#include <optional>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace vllm_mlx_kernels {

namespace mx = mlx::core;

// x * rsqrt(mean(x * x, -1) + eps) * weight, over x's last axis (float32 x and weight).
mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps,
                   mx::StreamOrDevice s = {});

// mx.fast.rope for float32 x of rank 3 or 4 (batch, [heads,] sequence, features): offset is
// one int32 or one per batch row; `base` or `freqs` (dims / 2 of them) sets the
// frequencies.
mx::array rope(const mx::array& x, int dims, bool traditional, std::optional<float> base,
               float scale, const mx::array& offset,
               const std::optional<mx::array>& freqs = std::nullopt,
               mx::StreamOrDevice s = {});

class FastRmsNorm : public mx::UnaryPrimitive {
 public:
  FastRmsNorm(mx::Stream stream, float eps) : mx::UnaryPrimitive(stream), eps_(eps) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override {
    return "VllmMlxRmsNorm";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const FastRmsNorm&>(other).eps_;
  }

 private:
  float eps_;
};

class FastRope : public mx::UnaryPrimitive {
 public:
  FastRope(mx::Stream stream, int dims, bool traditional, float base, float scale)
      : mx::UnaryPrimitive(stream), dims_(dims), traditional_(traditional), base_(base),
        scale_(scale) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override {
    return "VllmMlxRope";
  }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  int dims_;
  bool traditional_;
  float base_; // unused when freqs are given (a third input)
  float scale_;
};

} // namespace vllm_mlx_kernels
