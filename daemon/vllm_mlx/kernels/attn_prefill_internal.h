// What the instruction-set-specific tiles of the fused prefill attention
// (attn_prefill_avx2.cpp, attn_prefill_avx512.cpp) share with the driver in attn_prefill.cpp:
// the block sizes, the three steps' signatures and each instruction set's steps.
#pragma once

#include <cstdint>
#include <limits>

namespace vllm_mlx_kernels::prefill {

constexpr int kQ = 64; // lanes per unit at most (4 AVX-512 vectors, 8 AVX2 ones)
constexpr int kLaneStep = 16; // a unit's lanes W are a multiple of this: 16, 32, 48 or 64
constexpr int kK = 64; // keys per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Every step computes the unit's W lanes (a multiple of kLaneStep, at most kQ), each row of
// its arrays W floats long; each lane's arithmetic is the same whatever W is.
// s[j * W + i] = bias[j * W + i] (0 when null) + sum_d k[j * kst + d] * qt[d * W + i]
// for j < nk (qt: D x W).
using QkFn = void (*)(const float* qt, int W, int D, const float* k, int64_t kst, int nk,
                      const float* bias, float* s);
// The online softmax of one block, lane-wise: m and l (W each) updated; s (nk x W)
// becomes p; alpha (W) receives the factor for the output so far.
using OnlineFn = void (*)(float* s, int W, int nk, float* m, float* l, float* alpha);
// ot[c * W + i] = ot[c * W + i] * alpha[i] + sum_{j < nk} v[j * vst + c] * p[j * W + i]
// for c < Dv; acc: scratch of Dv x W (the portable path's).
using PvFn = void (*)(const float* p, int W, int nk, const float* v, int64_t vst, int Dv,
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

// A tile template of n (1 to 5) rows and C vectors of lanes.
#define BY_ROWS_C(fn, C, n, ...)                                                             \
  switch (n) {                                                                               \
    case 1: fn<1, C>(__VA_ARGS__); break;                                                    \
    case 2: fn<2, C>(__VA_ARGS__); break;                                                    \
    case 3: fn<3, C>(__VA_ARGS__); break;                                                    \
    case 4: fn<4, C>(__VA_ARGS__); break;                                                    \
    case 5: fn<5, C>(__VA_ARGS__); break;                                                    \
    default: break;                                                                          \
  }

// A function template of the C = W / 16 vectors of 16 lanes a unit computes.
#define BY_LANES(fn, W, ...)                                                                 \
  switch ((W) / kLaneStep) {                                                                 \
    case 1: fn<1>(__VA_ARGS__); break;                                                       \
    case 2: fn<2>(__VA_ARGS__); break;                                                       \
    case 3: fn<3>(__VA_ARGS__); break;                                                       \
    default: fn<4>(__VA_ARGS__); break;                                                      \
  }

#endif // __x86_64__

} // namespace vllm_mlx_kernels::prefill
