// The MLX side: an op that builds a graph node for the CPU kernel in qmm_kernel.h.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "qmm_kernel.h"

namespace vllm_mlx_kernels {

namespace mx = mlx::core;

// std::invalid_argument ("vllm_mlx <op>: ...") unless (w, scales, biases) are affine
// weights the kernel takes for a product over K inputs.
void check_weights(int K, const mx::array& w, const mx::array& scales, const mx::array& biases,
                   int group_size, int bits, const char* op);

// The kernel's name for a scales dtype (float32, float16 or bfloat16).
ScaleType scale_type(mx::Dtype t);

// quantized_matmul(x, w, scales, biases, transpose=True, group_size, bits), affine mode.
// Inputs with more than `max_rows` rows go to dequantize + matmul (BLAS) instead.
// `int8`: the rows the kernel takes use int8 activations where granted (qmm_kernel.h).
mx::array quantized_matmul(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    int group_size,
    int bits,
    int max_rows,
    bool int8 = false,
    mx::StreamOrDevice s = {});

// quantized_matmul of one x by several weight sets of one group size and bits (a layer's
// q, k and v projections, an MLP's gate and up), as one graph node and one split over the
// kernel's threads (qmm_many). Each output has the same bits as quantized_matmul(x, w_i,
// ...) alone; rows beyond `max_rows` and other devices take quantized_matmul per set.
std::vector<mx::array> quantized_matmul_many(
    const mx::array& x,
    const std::vector<mx::array>& ws,
    const std::vector<mx::array>& scales,
    const std::vector<mx::array>& biases,
    int group_size,
    int bits,
    int max_rows,
    bool int8 = false,
    mx::StreamOrDevice s = {});

// The float32 weights [N, K] of an affine-quantized w (dequant.h), as mx.dequantize
// computes them, on every core; the CPU prefill path of quantized_matmul uses it.
mx::array dequantize(
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    int group_size,
    int bits,
    mx::StreamOrDevice s = {});

class FastDequantize : public mx::UnaryPrimitive {
 public:
  FastDequantize(mx::Stream stream, int group_size, int bits)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "VllmMlxDequantize";
  }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  int group_size_;
  int bits_;
};

class FastQuantizedMatmul : public mx::UnaryPrimitive {
 public:
  FastQuantizedMatmul(mx::Stream stream, int group_size, int bits, bool int8)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits), int8_(int8) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "VllmMlxQuantizedMatmul";
  }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  int group_size_;
  int bits_;
  bool int8_;
};

class FastQuantizedMatmulMany : public mx::Primitive {
 public:
  FastQuantizedMatmulMany(mx::Stream stream, int group_size, int bits, bool int8)
      : mx::Primitive(stream), group_size_(group_size), bits_(bits), int8_(int8) {}

  // inputs: x, then (w, scales, biases) per set; one output per set.
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;

  const char* name() const override {
    return "VllmMlxQuantizedMatmulMany";
  }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  int group_size_;
  int bits_;
  bool int8_;
};

} // namespace vllm_mlx_kernels
