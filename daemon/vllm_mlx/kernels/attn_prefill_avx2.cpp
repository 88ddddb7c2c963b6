// The AVX2/FMA steps of the fused prefill attention (target attributes; attn_prefill.cpp
// picks them at run time when isa() is "avx2"): a unit's W query lanes in passes of 16
// (2 ymm vectors), K and V elements broadcast one at a time.
#include "act_kernel.h"
#include "attn_prefill_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace vllm_mlx_kernels::prefill {

namespace {

#define AVX2 __attribute__((target("avx2,fma")))

// AVX2: R keys (or columns of V) x 16 query lanes (2 vectors), the W lanes in W / 16 passes;
// R = 6 uses 15 of the 16 ymm registers.
template <int R, int W>
AVX2 inline void qk_tile_avx2(const float* qt, int D, const float* k, int64_t kst,
                              const float* bias, float* s) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < 2; ++c) {
      acc[r][c] = bias != nullptr ? _mm256_loadu_ps(bias + r * W + 8 * c) : _mm256_setzero_ps();
    }
  }
  for (int d = 0; d < D; ++d) {
    __m256 q0 = _mm256_loadu_ps(qt + d * W), q1 = _mm256_loadu_ps(qt + d * W + 8);
    for (int r = 0; r < R; ++r) {
      __m256 kv = _mm256_set1_ps(k[r * kst + d]);
      acc[r][0] = _mm256_fmadd_ps(kv, q0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(kv, q1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(s + r * W, acc[r][0]);
    _mm256_storeu_ps(s + r * W + 8, acc[r][1]);
  }
}

template <int R, int W>
AVX2 inline void pv_tile_avx2(const float* p, int nk, const float* v, int64_t vst,
                              const float* alpha, float* ot) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) {
    acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  }
  for (int j = 0; j < nk; ++j) {
    __m256 p0 = _mm256_loadu_ps(p + j * W), p1 = _mm256_loadu_ps(p + j * W + 8);
    for (int r = 0; r < R; ++r) {
      __m256 vv = _mm256_set1_ps(v[j * vst + r]);
      acc[r][0] = _mm256_fmadd_ps(vv, p0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(vv, p1, acc[r][1]);
    }
  }
  __m256 a0 = _mm256_loadu_ps(alpha), a1 = _mm256_loadu_ps(alpha + 8);
  for (int r = 0; r < R; ++r) {
    float* o = ot + r * W;
    _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(o), a0, acc[r][0]));
    _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_loadu_ps(o + 8), a1, acc[r][1]));
  }
}

// The lane count is a template argument (C vectors of 16): with W in a register the
// tiles' addressing took the registers the accumulators need (64 lanes 4-14% slower).
template <int C>
AVX2 void qk_lanes(const float* qt, int D, const float* k, int64_t kst, int nk,
                   const float* bias, float* s) {
  constexpr int W = 16 * C;
  for (int c = 0; c < W; c += 16) {
    int j = 0;
    for (; j + 6 <= nk; j += 6) {
      qk_tile_avx2<6, W>(qt + c, D, k + j * kst, kst,
                      bias == nullptr ? nullptr : bias + j * W + c, s + j * W + c);
    }
    BY_ROWS_C(qk_tile_avx2, W, nk - j, qt + c, D, k + j * kst, kst,
            bias == nullptr ? nullptr : bias + j * W + c, s + j * W + c)
  }
}

template <int C>
AVX2 void online_lanes(float* s, int nk, float* m, float* l, float* alpha) {
  constexpr int W = 16 * C;
  const __m256 ninf = _mm256_set1_ps(kNegInf);
  for (int c = 0; c < W; c += 8) {
    __m256 old = _mm256_loadu_ps(m + c);
    __m256 top = old;
    for (int j = 0; j < nk; ++j) {
      top = _mm256_max_ps(top, _mm256_loadu_ps(s + j * W + c));
    }
    __m256 shift = _mm256_andnot_ps(_mm256_cmp_ps(top, ninf, _CMP_EQ_OQ), top);
    _mm256_storeu_ps(alpha + c, _mm256_sub_ps(old, shift));
    _mm256_storeu_ps(m + c, top);
    for (int j = 0; j < nk; ++j) {
      float* sj = s + j * W + c;
      _mm256_storeu_ps(sj, _mm256_sub_ps(_mm256_loadu_ps(sj), shift));
    }
  }
  exp_inplace(s, static_cast<size_t>(nk) * W);
  exp_inplace(alpha, W);
  for (int c = 0; c < W; c += 8) {
    __m256 sum = _mm256_setzero_ps();
    for (int j = 0; j < nk; ++j) {
      sum = _mm256_add_ps(sum, _mm256_loadu_ps(s + j * W + c));
    }
    __m256 lv = _mm256_mul_ps(_mm256_loadu_ps(l + c), _mm256_loadu_ps(alpha + c));
    _mm256_storeu_ps(l + c, _mm256_add_ps(lv, sum));
  }
}

template <int C>
AVX2 void pv_lanes(const float* p, int nk, const float* v, int64_t vst, int Dv,
                   const float* alpha, float* ot) {
  constexpr int W = 16 * C;
  for (int q = 0; q < W; q += 16) {
    int c = 0;
    for (; c + 6 <= Dv; c += 6) {
      pv_tile_avx2<6, W>(p + q, nk, v + c, vst, alpha + q, ot + c * W + q);
    }
    BY_ROWS_C(pv_tile_avx2, W, Dv - c, p + q, nk, v + c, vst, alpha + q, ot + c * W + q)
  }
}

AVX2 void qk_avx2(const float* qt, int W, int D, const float* k, int64_t kst, int nk,
                  const float* bias, float* s) {
  BY_LANES(qk_lanes, W, qt, D, k, kst, nk, bias, s)
}

AVX2 void online_avx2(float* s, int W, int nk, float* m, float* l, float* alpha) {
  BY_LANES(online_lanes, W, s, nk, m, l, alpha)
}

AVX2 void pv_avx2(const float* p, int W, int nk, const float* v, int64_t vst, int Dv,
                  const float* alpha, float* ot, float*) {
  BY_LANES(pv_lanes, W, p, nk, v, vst, Dv, alpha, ot)
}

} // namespace

Ops ops_avx2() {
  return {qk_avx2, online_avx2, pv_avx2};
}

} // namespace vllm_mlx_kernels::prefill

#endif // __x86_64__
