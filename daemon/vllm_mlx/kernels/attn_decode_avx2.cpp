// The AVX2 steps of the decode attention (target attributes; attn_kernel.cpp picks them
// at run time when isa() is "avx2"), and the dequantization of a quantized K or V row that
// the AVX-512 steps use too.
#include <algorithm>

#include "attn_decode_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace vllm_mlx_kernels::decode {

#define AVX2 __attribute__((target("avx2,fma")))

namespace {

AVX2 inline __m256i mask8(int n) { // lanes below min(max(n, 0), 8) all ones
  static const int32_t table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table + 8 - std::clamp(n, 0, 8)));
}

AVX2 inline float sum8(__m256 x) { // one fixed order
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// Lane u = sum8(a[u]) bit for bit, for 8 vectors at once: each level adds the pairs
// sum8 adds (the two 4-lane halves, then lanes 0 + 2 and 1 + 3, then those two), two
// vectors' halves packed into one register, so the 8 reductions share 21 instructions
// instead of ~6 and a scalar store each.
AVX2 inline __m256 sum8x8(const __m256 (&a)[8]) {
  __m256 b[4], e[2];
  for (int u = 0; u < 4; ++u) { // lanes 0-3: a[u]'s halves summed; 4-7: a[u + 4]'s
    b[u] = _mm256_add_ps(_mm256_permute2f128_ps(a[u], a[u + 4], 0x20),
                         _mm256_permute2f128_ps(a[u], a[u + 4], 0x31));
  }
  for (int i = 0; i < 2; ++i) { // per 128-bit lane: b[2i]'s 0 + 2, 1 + 3, then b[2i + 1]'s
    e[i] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // Per 128-bit lane: the two partial sums of b[0], b[1], b[2], b[3] added: a[0..3] in the
  // low lane, a[4..7] in the high one, in order.
  return _mm256_add_ps(_mm256_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Scores of 8 keys at a time (D a multiple of 8): each query vector loaded once for the 8
// keys, their 8 sums in registers and reduced together. Each sum is the one-key loop's
// (the same FMAs over d in order, then sum8's pairs), so the bits do not depend on where
// a key falls.
template <int NG>
AVX2 void scores_by_8(const float* qs, int D, const float* k, int64_t kst, int T8, float* s,
                      int64_t sst) {
  for (int j = 0; j < NG; ++j) {
    for (int t0 = 0; t0 < T8; t0 += 8) {
      __m256 acc[8];
      for (int u = 0; u < 8; ++u) {
        acc[u] = _mm256_setzero_ps();
      }
      for (int d = 0; d < D; d += 8) {
        const __m256 q = _mm256_loadu_ps(qs + j * D + d);
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u) {
          acc[u] = _mm256_fmadd_ps(q, _mm256_loadu_ps(k + (t0 + u) * kst + d), acc[u]);
        }
      }
      _mm256_storeu_ps(s + j * sst + t0, sum8x8(acc));
    }
  }
}

template <int NG>
AVX2 void scores_avx2_n(const float* qs, int D, const float* k, int64_t kst, int T, float* s,
                       int64_t sst) {
  int t = 0;
  if (D % 8 == 0) {
    t = T / 8 * 8;
    scores_by_8<NG>(qs, D, k, kst, t, s, sst);
  }
  for (; t < T; ++t) {
    const float* kr = k + t * kst;
    __m256 acc[NG];
    for (int j = 0; j < NG; ++j) {
      acc[j] = _mm256_setzero_ps();
    }
    for (int d = 0; d < D; d += 8) {
      __m256i m = mask8(D - d);
      __m256 kv = _mm256_maskload_ps(kr + d, m);
      for (int j = 0; j < NG; ++j) {
        acc[j] = _mm256_fmadd_ps(_mm256_maskload_ps(qs + j * D + d, m), kv, acc[j]);
      }
    }
    for (int j = 0; j < NG; ++j) {
      s[j * sst + t] = sum8(acc[j]);
    }
  }
}

// 2 vectors of V per pass: NG x 2 accumulators + 2 loads stay within the 16 ymm registers.
template <int NG>
AVX2 void pv_avx2_n(const float* pr, int64_t sst, int T, const float* v, int64_t vst, int Dv,
                   float* out, int64_t ost, bool add) {
  for (int c = 0; c < Dv; c += 16) {
    __m256i m[2] = {mask8(Dv - c), mask8(Dv - c - 8)};
    __m256 acc[NG][2];
    for (int j = 0; j < NG; ++j) {
      if (add) {
        acc[j][0] = _mm256_maskload_ps(out + j * ost + c, m[0]);
        acc[j][1] = _mm256_maskload_ps(out + j * ost + c + 8, m[1]);
      } else {
        acc[j][0] = acc[j][1] = _mm256_setzero_ps();
      }
    }
    for (int t = 0; t < T; ++t) {
      const float* vr = v + t * vst + c;
      __m256 v0 = _mm256_maskload_ps(vr, m[0]);
      __m256 v1 = _mm256_maskload_ps(vr + 8, m[1]);
      for (int j = 0; j < NG; ++j) {
        __m256 pj = _mm256_set1_ps(pr[j * sst + t]);
        acc[j][0] = _mm256_fmadd_ps(pj, v0, acc[j][0]);
        acc[j][1] = _mm256_fmadd_ps(pj, v1, acc[j][1]);
      }
    }
    for (int j = 0; j < NG; ++j) {
      _mm256_maskstore_ps(out + j * ost + c, m[0], acc[j][0]);
      _mm256_maskstore_ps(out + j * ost + c + 8, m[1], acc[j][1]);
    }
  }
}

void scores_avx2(const float* qs, int ng, int D, const float* k, int64_t kst, int T, float* s,
                 int64_t sst) {
  BY_BLOCK(scores_avx2_n, ng, qs, D, k, kst, T, s, sst)
}
void pv_avx2(const float* pr, int64_t sst, int ng, int T, const float* v, int64_t vst, int Dv,
             float* o, int64_t ost, bool add) {
  BY_BLOCK(pv_avx2_n, ng, pr, sst, T, v, vst, Dv, o, ost, add)
}

} // namespace

// 8 elements at a time (D and the group size are multiples of 8).
AVX2 void dequant_avx2(const uint32_t* w, const float* scales, const float* biases, int D,
                       int group_size, int bits, float* out) {
  if (bits == 8) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(w); // little-endian: element i
    for (int i = 0; i < D; i += 8) {
      __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + i));
      __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(raw));
      __m256 scaled = _mm256_mul_ps(_mm256_set1_ps(scales[i / group_size]), q);
      _mm256_storeu_ps(out + i, _mm256_add_ps(scaled, _mm256_set1_ps(biases[i / group_size])));
    }
    return;
  }
  if (bits == 4) {
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i low = _mm256_set1_epi32(0xF);
    for (int i = 0; i < D; i += 8) {
      __m256i word = _mm256_set1_epi32(static_cast<int>(w[i / 8]));
      __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(word, shifts), low));
      __m256 scaled = _mm256_mul_ps(_mm256_set1_ps(scales[i / group_size]), q);
      _mm256_storeu_ps(out + i, _mm256_add_ps(scaled, _mm256_set1_ps(biases[i / group_size])));
    }
    return;
  }
  dequant_scalar(w, scales, biases, D, group_size, bits, out);
}

Steps steps_avx2() {
  return {scores_avx2, pv_avx2, dequant_avx2};
}

} // namespace vllm_mlx_kernels::decode

#endif // __x86_64__
