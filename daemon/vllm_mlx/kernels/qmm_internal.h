// What the instruction-set-specific tiles (qmm_avx2.cpp, qmm_avx512.cpp, qmm_neon.cpp) share with the
// dispatcher in qmm_kernel.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "qmm_kernel.h"

namespace vllm_mlx_kernels {

// The activations the kernels read: x reordered to match how weights unpack (4-bit
// kernels unpack a chunk of 2 * `block` weights as the low nibbles, then the high ones;
// block 8 for AVX2 and NEON, 16 for AVX-512, 0: natural order), and x's sum over each group (the
// bias term is b[n, g] * sum of x over group g).
struct Prepared {
  std::vector<float> x;
  std::vector<float> sums;
};

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float half_to_float(uint16_t h);

// Output rows [n_begin, n_end) of y, per instruction set. n_begin is a multiple of 4.
void rows_avx2(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end);
void rows_avx512(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end);
void rows_neon(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end);

} // namespace vllm_mlx_kernels
