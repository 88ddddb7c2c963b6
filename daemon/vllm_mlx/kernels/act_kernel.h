// Fused SwiGLU on the CPU: out[i] = (g[i] * sigmoid(g[i])) * u[i], with MLX's own
// arithmetic (its CPU `simd::exp` and `Sigmoid`, which the Linux wheel runs one float at
// a time and with a library call per fma), so the result is bit-identical to
// mlx_lm's compiled `swiglu` and a model gives the same logits with or without it.
#pragma once

#include <cstddef>

namespace vllm_mlx_kernels {

// n elements; g, u and out may alias only as out == g or out == u.
void swiglu(const float* g, const float* u, float* out, size_t n);

// x[i] = exp(x[i]) with MLX's CPU `exp` (the same bits as its softmax computes), n elements;
// the instruction set isa() names, like swiglu.
void exp_inplace(float* x, size_t n);

} // namespace vllm_mlx_kernels
