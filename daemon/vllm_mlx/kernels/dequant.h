// Affine dequantize on the CPU, threaded: the weights a prefill matmul hands to BLAS.
// MLX's own CPU dequantize is one scalar loop on one thread, ~60 ms per layer of the
// bundled model (a fixed ~1.8 s per 512-row prefill chunk); this writes the same floats
// (s * q + b, no fused multiply-add) with every core.
#pragma once

#include "qmm_kernel.h"

namespace vllm_mlx_kernels {

// w[n, k] = s[n, g] * q[n, k] + b[n, g] into out ([N, K] float32, row-major); reads
// p.w, p.scales, p.biases, p.N, p.K, p.group_size, p.bits, p.scale_type.
void dequantize_weights(const QmmProblem& p, float* out);

} // namespace vllm_mlx_kernels
