// The MLX side of the fused activation in act_kernel.h: an op that builds a graph node.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace vllm_mlx_kernels {

namespace mx = mlx::core;

// silu(gate) * up for float32 arrays of one shape, bit-identical to mlx_lm's `swiglu`.
mx::array swiglu(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s = {});

class FastSwiglu : public mx::UnaryPrimitive {
 public:
  explicit FastSwiglu(mx::Stream stream) : mx::UnaryPrimitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "VllmMlxSwiglu";
  }
  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
};

} // namespace vllm_mlx_kernels
