// The AVX-512 steps of the decode attention (target attributes; attn_kernel.cpp picks
// them at run time when isa() is "avx512"): scores 16 keys at a time, P.V up to 4 vectors
// of V per pass.
#include "attn_decode_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx2,fma")))
#include "lanes_avx512.h"

namespace vllm_mlx_kernels::decode {

namespace {

AVX512 inline __mmask16 mask16(int n) { // the first min(max(n, 0), 16) lanes
  return n >= 16 ? static_cast<__mmask16>(0xffff)
                 : static_cast<__mmask16>(n <= 0 ? 0 : (1u << n) - 1);
}

// Scores of 16 keys at a time for head dimensions 64 and 128 (DV vectors): the query
// row stays in registers and the 16 sums are reduced together.
template <int NG, int DV>
AVX512 void scores_by_16(const float* qs, const float* k, int64_t kst, int T16, float* s,
                         int64_t sst) {
  for (int j = 0; j < NG; ++j) {
    __m512 q[DV];
    for (int d = 0; d < DV; ++d) {
      q[d] = _mm512_loadu_ps(qs + j * 16 * DV + 16 * d);
    }
    for (int t0 = 0; t0 < T16; t0 += 16) {
      __m512 acc[16];
      // Unrolled, the 16 sums stay in registers (rolled, GCC stored each to the stack and
      // reloaded it for the reduction).
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const float* kr = k + (t0 + i) * kst;
        __m512 sum = _mm512_setzero_ps();
        for (int d = 0; d < DV; ++d) {
          sum = _mm512_fmadd_ps(q[d], _mm512_loadu_ps(kr + 16 * d), sum);
        }
        acc[i] = sum;
      }
      _mm512_storeu_ps(s + j * sst + t0, reduce_add16(acc));
    }
  }
}

template <int NG>
AVX512 void scores_avx512_n(const float* qs, int D, const float* k, int64_t kst, int T,
                            float* s, int64_t sst) {
  int t = 0;
  if (D == 64 || D == 128) {
    t = T / 16 * 16;
    if (D == 64) {
      scores_by_16<NG, 4>(qs, k, kst, t, s, sst);
    } else {
      scores_by_16<NG, 8>(qs, k, kst, t, s, sst);
    }
  }
  for (; t < T; ++t) {
    const float* kr = k + t * kst;
    __m512 acc[NG];
    for (int j = 0; j < NG; ++j) {
      acc[j] = _mm512_setzero_ps();
    }
    for (int d = 0; d < D; d += 16) {
      __mmask16 m = mask16(D - d);
      __m512 kv = _mm512_maskz_loadu_ps(m, kr + d);
      for (int j = 0; j < NG; ++j) {
        acc[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qs + j * D + d), kv, acc[j]);
      }
    }
    for (int j = 0; j < NG; ++j) {
      s[j * sst + t] = reduce_add(acc[j]);
    }
  }
}

// NV vectors of V per pass (up to 4: NG x 4 accumulators + 4 loads fit the 32 zmm
// registers); fewer when a call covers only some of the columns.
template <int NG, int NV>
AVX512 void pv_avx512_nv(const float* pr, int64_t sst, int T, const float* v, int64_t vst,
                         int Dv, float* out, int64_t ost, bool add) {
  for (int c = 0; c < Dv; c += 16 * NV) {
    __mmask16 m[NV];
    __m512 acc[NG][NV];
    for (int i = 0; i < NV; ++i) {
      m[i] = mask16(Dv - c - 16 * i);
      for (int j = 0; j < NG; ++j) {
        acc[j][i] = add ? _mm512_maskz_loadu_ps(m[i], out + j * ost + c + 16 * i)
                        : _mm512_setzero_ps();
      }
    }
    for (int t = 0; t < T; ++t) {
      const float* vr = v + t * vst + c;
      __m512 vv[NV];
      for (int i = 0; i < NV; ++i) {
        vv[i] = _mm512_maskz_loadu_ps(m[i], vr + 16 * i);
      }
      for (int j = 0; j < NG; ++j) {
        __m512 pj = _mm512_set1_ps(pr[j * sst + t]);
        for (int i = 0; i < NV; ++i) {
          acc[j][i] = _mm512_fmadd_ps(pj, vv[i], acc[j][i]);
        }
      }
    }
    for (int j = 0; j < NG; ++j) {
      for (int i = 0; i < NV; ++i) {
        _mm512_mask_storeu_ps(out + j * ost + c + 16 * i, m[i], acc[j][i]);
      }
    }
  }
}

template <int NG>
AVX512 void pv_avx512_n(const float* pr, int64_t sst, int T, const float* v, int64_t vst,
                        int Dv, float* out, int64_t ost, bool add) {
  if (Dv > 32) {
    pv_avx512_nv<NG, 4>(pr, sst, T, v, vst, Dv, out, ost, add);
  } else if (Dv > 16) {
    pv_avx512_nv<NG, 2>(pr, sst, T, v, vst, Dv, out, ost, add);
  } else {
    pv_avx512_nv<NG, 1>(pr, sst, T, v, vst, Dv, out, ost, add);
  }
}

void scores_avx512(const float* qs, int ng, int D, const float* k, int64_t kst, int T,
                   float* s, int64_t sst) {
  BY_BLOCK(scores_avx512_n, ng, qs, D, k, kst, T, s, sst)
}
void pv_avx512(const float* pr, int64_t sst, int ng, int T, const float* v, int64_t vst, int Dv,
               float* o, int64_t ost, bool add) {
  BY_BLOCK(pv_avx512_n, ng, pr, sst, T, v, vst, Dv, o, ost, add)
}

} // namespace

Steps steps_avx512() {
  return {scores_avx512, pv_avx512, dequant_avx2};
}

} // namespace vllm_mlx_kernels::decode

#endif // __x86_64__
