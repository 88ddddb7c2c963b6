// What the instruction-set-specific steps of the decode attention (attn_decode_avx2.cpp,
// attn_decode_avx512.cpp) share with the driver in attn_kernel.cpp: the block of query
// rows per pass, the steps' signatures and each instruction set's steps.
#pragma once

#include <cstdint>

#include "attn_kernel.h"

namespace vllm_mlx_kernels::decode {

constexpr int kBlock = 4; // query heads per pass over K and V (registers: see the PV loops)

// scores[j * sst + t] for j < ng, t < T; and out[j * ost + d] = sum_t p[j * sst + t] *
// v[t][d] for d < Dv (with `add`: out += that, the partial sums of earlier positions'
// blocks). Each out element's sum runs over t alone, so a call for some of the columns
// (v and out advanced to the first, Dv the count) gives them the bits of a whole call.
using ScoresFn = void (*)(const float* qs, int ng, int D, const float* k, int64_t kst, int T,
                          float* s, int64_t sst);
using PvFn = void (*)(const float* pr, int64_t sst, int ng, int T, const float* v, int64_t vst,
                      int Dv, float* out, int64_t ost, bool add);

// One position's row of a quantized K or V: out[i] = scale * q + bias, no fused
// multiply-add (MLX's dequantize), so every instruction set writes the same floats.
using DequantFn = void (*)(const uint32_t* w, const float* scales, const float* biases, int D,
                           int group_size, int bits, float* out);

struct Steps {
  ScoresFn scores;
  PvFn pv;
  DequantFn dequant;
};

// Rows [t0, t0 + n) of sequence b, KV head kh of a quantized K or V into out ([n][dim],
// row-major), one `dequant` call a row (attn_kernel.cpp; the prefill attention's key
// blocks use it too).
void dequant_rows(const QuantizedRows& rows, DequantFn dequant, int group_size, int bits,
                  int b, int kh, int t0, int n, int dim, float* out);

// The dequantization of the instruction set isa() names (the AVX-512 steps use AVX2's).
DequantFn dequant_for_isa();

// The portable steps (attn_kernel.cpp); the AVX2 dequantization falls back to them for
// other widths than 4 and 8 bits.
Steps steps_scalar();
void dequant_scalar(const uint32_t* w, const float* scales, const float* biases, int D,
                    int group_size, int bits, float* out);

#if defined(__x86_64__)

// Compiled with their target attributes; attn_kernel.cpp takes them only when isa()
// names that set.
Steps steps_avx512();
Steps steps_avx2();
void dequant_avx2(const uint32_t* w, const float* scales, const float* biases, int D,
                  int group_size, int bits, float* out);

// The block size is a template argument so the accumulators live in registers.
#define BY_BLOCK(fn, ng, ...)                                                                \
  switch (ng) {                                                                              \
    case 1: fn<1>(__VA_ARGS__); break;                                                       \
    case 2: fn<2>(__VA_ARGS__); break;                                                       \
    case 3: fn<3>(__VA_ARGS__); break;                                                       \
    default: fn<4>(__VA_ARGS__); break;                                                      \
  }

#endif // __x86_64__

} // namespace vllm_mlx_kernels::decode
