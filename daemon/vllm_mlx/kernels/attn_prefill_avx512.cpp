// The AVX-512 steps of the fused prefill attention (target attributes; attn_prefill.cpp
// picks them at run time when isa() is "avx512"): each of a unit's W query lanes is a lane
// of one of W / 16 zmm vectors (attn_prefill.cpp's layout), K and V elements are broadcast
// one at a time.
#include "act_kernel.h"
#include "attn_prefill_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace vllm_mlx_kernels::prefill {

namespace {

#define AVX512 __attribute__((target("avx512f,avx2,fma")))

// R keys x C vectors of query lanes: R * C accumulators, C loads of q and a broadcast of
// k per step of d; R = 6, C = 4 uses 29 of the 32 zmm registers.
template <int R, int C>
AVX512 inline void qk_tile_avx512(const float* qt, int D, const float* k, int64_t kst,
                                  const float* bias, float* s) {
  constexpr int W = 16 * C;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      acc[r][c] = bias != nullptr ? _mm512_loadu_ps(bias + r * W + 16 * c) : _mm512_setzero_ps();
    }
  }
  for (int d = 0; d < D; ++d) {
    __m512 q[C];
    for (int c = 0; c < C; ++c) {
      q[c] = _mm512_loadu_ps(qt + d * W + 16 * c);
    }
    for (int r = 0; r < R; ++r) {
      __m512 kv = _mm512_set1_ps(k[r * kst + d]);
      for (int c = 0; c < C; ++c) {
        acc[r][c] = _mm512_fmadd_ps(kv, q[c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      _mm512_storeu_ps(s + r * W + 16 * c, acc[r][c]);
    }
  }
}

// R columns of V x C vectors of query lanes, summed over the block's keys, then folded
// into ot.
template <int R, int C>
AVX512 inline void pv_tile_avx512(const float* p, int nk, const float* v, int64_t vst,
                                  const float* alpha, float* ot) {
  constexpr int W = 16 * C;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      acc[r][c] = _mm512_setzero_ps();
    }
  }
  for (int j = 0; j < nk; ++j) {
    __m512 pj[C];
    for (int c = 0; c < C; ++c) {
      pj[c] = _mm512_loadu_ps(p + j * W + 16 * c);
    }
    for (int r = 0; r < R; ++r) {
      __m512 vv = _mm512_set1_ps(v[j * vst + r]);
      for (int c = 0; c < C; ++c) {
        acc[r][c] = _mm512_fmadd_ps(vv, pj[c], acc[r][c]);
      }
    }
  }
  for (int c = 0; c < C; ++c) {
    __m512 a = _mm512_loadu_ps(alpha + 16 * c);
    for (int r = 0; r < R; ++r) {
      float* o = ot + r * W + 16 * c;
      _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_loadu_ps(o), a, acc[r][c]));
    }
  }
}

// The lane count is a template argument (C vectors of 16), so the tiles' addressing is
// constant.
template <int C>
AVX512 void qk_lanes(const float* qt, int D, const float* k, int64_t kst, int nk,
                     const float* bias, float* s) {
  constexpr int W = 16 * C;
  int j = 0;
  for (; j + 6 <= nk; j += 6) {
    qk_tile_avx512<6, C>(qt, D, k + j * kst, kst, bias == nullptr ? nullptr : bias + j * W,
                         s + j * W);
  }
  BY_ROWS_C(qk_tile_avx512, C, nk - j, qt, D, k + j * kst, kst,
            bias == nullptr ? nullptr : bias + j * W, s + j * W)
}

template <int C>
AVX512 void pv_lanes(const float* p, int nk, const float* v, int64_t vst, int Dv,
                     const float* alpha, float* ot) {
  constexpr int W = 16 * C;
  int c = 0;
  for (; c + 6 <= Dv; c += 6) {
    pv_tile_avx512<6, C>(p, nk, v + c, vst, alpha, ot + c * W);
  }
  BY_ROWS_C(pv_tile_avx512, C, Dv - c, p, nk, v + c, vst, alpha, ot + c * W)
}

AVX512 void qk_avx512(const float* qt, int W, int D, const float* k, int64_t kst, int nk,
                      const float* bias, float* s) {
  BY_LANES(qk_lanes, W, qt, D, k, kst, nk, bias, s)
}

AVX512 void online_avx512(float* s, int W, int nk, float* m, float* l, float* alpha) {
  const __m512 ninf = _mm512_set1_ps(kNegInf);
  for (int c = 0; c < W; c += 16) {
    __m512 old = _mm512_loadu_ps(m + c);
    __m512 top = old;
    for (int j = 0; j < nk; ++j) {
      top = _mm512_max_ps(top, _mm512_loadu_ps(s + j * W + c));
    }
    __m512 shift = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(top, ninf, _CMP_EQ_OQ), top,
                                        _mm512_setzero_ps());
    _mm512_storeu_ps(alpha + c, _mm512_sub_ps(old, shift));
    _mm512_storeu_ps(m + c, top);
    for (int j = 0; j < nk; ++j) {
      float* sj = s + j * W + c;
      _mm512_storeu_ps(sj, _mm512_sub_ps(_mm512_loadu_ps(sj), shift));
    }
  }
  exp_inplace(s, static_cast<size_t>(nk) * W);
  exp_inplace(alpha, W);
  for (int c = 0; c < W; c += 16) {
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < nk; ++j) {
      sum = _mm512_add_ps(sum, _mm512_loadu_ps(s + j * W + c));
    }
    __m512 lv = _mm512_mul_ps(_mm512_loadu_ps(l + c), _mm512_loadu_ps(alpha + c));
    _mm512_storeu_ps(l + c, _mm512_add_ps(lv, sum));
  }
}

AVX512 void pv_avx512(const float* p, int W, int nk, const float* v, int64_t vst, int Dv,
                      const float* alpha, float* ot, float*) {
  BY_LANES(pv_lanes, W, p, nk, v, vst, Dv, alpha, ot)
}

} // namespace

Ops ops_avx512() {
  return {qk_avx512, online_avx512, pv_avx512};
}

} // namespace vllm_mlx_kernels::prefill

#endif // __x86_64__
