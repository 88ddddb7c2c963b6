// What the instruction-set-specific tiles of the fused prefill attention
// (attn_prefill_avx2.cpp, attn_prefill_avx512.cpp) share with the driver in attn_prefill.cpp:
// the block sizes, the three steps' signatures and each instruction set's steps.
#pragma once

#include <cstdint>
#include <limits>

namespace vllm_mlx_kernels::prefill {

constexpr int kQ = 64; // queries per unit: the lanes (4 AVX-512 vectors, 8 AVX2 ones)
constexpr int kK = 64; // keys per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// s[j * kQ + i] = bias[j * kQ + i] (0 when null) + sum_d k[j * kst + d] * qt[d * kQ + i]
// for j < nk (qt: D x kQ).
using QkFn = void (*)(const float* qt, int D, const float* k, int64_t kst, int nk,
                      const float* bias, float* s);
// The online softmax of one block, lane-wise: m and l (kQ each) updated; s (nk x kQ)
// becomes p; alpha (kQ) receives the factor for the output so far.
using OnlineFn = void (*)(float* s, int nk, float* m, float* l, float* alpha);
// ot[c * kQ + i] = ot[c * kQ + i] * alpha[i] + sum_{j < nk} v[j * vst + c] * p[j * kQ + i]
// for c < Dv; acc: scratch of Dv x kQ (the portable path's).
using PvFn = void (*)(const float* p, int nk, const float* v, int64_t vst, int Dv,
                      const float* alpha, float* ot, float* acc);

struct Ops {
  QkFn qk;
  OnlineFn online;
  PvFn pv;
};

#if defined(__x86_64__)

// The three steps per instruction set, compiled with its target attributes; attn_prefill.cpp
// takes them only when isa() names that set.
Ops ops_avx512();
Ops ops_avx2();

// A tile template for the n (1 to 5) rows left after the 6-row tiles.
#define BY_ROWS(fn, n, ...)                                                                  \
  switch (n) {                                                                               \
    case 1: fn<1>(__VA_ARGS__); break;                                                       \
    case 2: fn<2>(__VA_ARGS__); break;                                                       \
    case 3: fn<3>(__VA_ARGS__); break;                                                       \
    case 4: fn<4>(__VA_ARGS__); break;                                                       \
    case 5: fn<5>(__VA_ARGS__); break;                                                       \
    default: break;                                                                          \
  }

#endif // __x86_64__

} // namespace vllm_mlx_kernels::prefill
