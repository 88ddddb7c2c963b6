// The AVX-512 tiles (target attributes; qmm_kernel.cpp picks them at run time when the CPU
// and OS support AVX-512F). 4-bit weights: x is interleaved in blocks of 32
// (qmm_internal.h), so 16 bytes of weights unpack to 2 x 16 floats without shuffles.
//
// Two tiles, one arithmetic. Decode (one activation row): 4 output rows at a time; per
// group the q * x products are summed, then scaled once, and the bias term comes from x's
// group sums, so each weight costs one FMA. Several rows (batched decode, prefill): a
// chunk of one output row's weights is unpacked once for 8 activation rows (once per 4
// with AVX2), with the same per-element operations as decode (batch invariance).
#include "qmm_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace vllm_mlx_kernels {

namespace {

#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

AVX512 inline float scale_at(const QmmProblem& p, const void* base, size_t i) {
  switch (p.scale_type) {
    case ScaleType::f16: return _cvtsh_ss(static_cast<const uint16_t*>(base)[i]);
    case ScaleType::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

// The 32 weights of a row from k on, as floats, in the order x was prepared in.
template <int BITS>
AVX512 inline void unpack(const uint8_t* w, int k, __m512& lo, __m512& hi) {
  if constexpr (BITS == 4) {
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k / 2)));
    lo = _mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(0xf)));
    hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4));
  } else {
    auto at = [&](int o) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k + o)); };
    lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(at(0)));
    hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(at(16)));
  }
}

template <int BITS>
const uint8_t* row_of(const QmmProblem& p, int n) {
  return reinterpret_cast<const uint8_t*>(p.w) + static_cast<size_t>(n) * p.K * BITS / 8;
}

template <int BITS, int NT>
AVX512 void tile_decode(const QmmProblem& p, const Prepared& xp, int n0) {
  const int gs = p.group_size;
  const int groups = p.K / gs;
  const uint8_t* w[NT];
  __m512 tot[NT];
  float bias[NT];
  for (int j = 0; j < NT; ++j) {
    w[j] = row_of<BITS>(p, n0 + j);
    tot[j] = _mm512_setzero_ps();
    bias[j] = 0.0f;
  }
  const float* x = xp.x.data();
  for (int g = 0; g < groups; ++g) {
    __m512 acc0[NT], acc1[NT];
    for (int j = 0; j < NT; ++j) {
      acc0[j] = _mm512_setzero_ps();
      acc1[j] = _mm512_setzero_ps();
    }
    for (int k = g * gs; k < (g + 1) * gs; k += 32) {
      __m512 xl = _mm512_loadu_ps(x + k), xh = _mm512_loadu_ps(x + k + 16);
      for (int j = 0; j < NT; ++j) {
        __m512 lo, hi;
        unpack<BITS>(w[j], k, lo, hi);
        acc0[j] = _mm512_fmadd_ps(lo, xl, acc0[j]);
        acc1[j] = _mm512_fmadd_ps(hi, xh, acc1[j]);
      }
    }
    for (int j = 0; j < NT; ++j) {
      size_t at = static_cast<size_t>(n0 + j) * groups + g;
      __m512 scale = _mm512_set1_ps(scale_at(p, p.scales, at));
      tot[j] = _mm512_fmadd_ps(scale, _mm512_add_ps(acc0[j], acc1[j]), tot[j]);
      bias[j] += scale_at(p, p.biases, at) * xp.sums[g];
    }
  }
  for (int j = 0; j < NT; ++j) {
    p.y[n0 + j] = _mm512_reduce_add_ps(tot[j]) + bias[j];
  }
}

// MT activation rows x 1 output row: each chunk of weights is unpacked once for MT rows.
// Every output element takes exactly the operations tile_decode gives it (per group: q.x
// in two accumulators, scaled once; the bias term from x's group sums), so a row's result
// does not depend on how many rows share the call: a sequence decoded alone, in a batch,
// or re-fed after a prefix-cache hit sees bit-identical logits, and seeded sampling
// reproduces. 3 * MT accumulators: 24 of the 32 vector registers at MT 8.
template <int BITS, int MT>
AVX512 void tile_rows(const QmmProblem& p, const Prepared& xp, int m0, int n) {
  const int gs = p.group_size;
  const int groups = p.K / gs;
  const uint8_t* w = row_of<BITS>(p, n);
  const float* x[MT];
  const float* xs[MT];
  __m512 tot[MT];
  float bias[MT];
  for (int i = 0; i < MT; ++i) {
    x[i] = xp.x.data() + static_cast<size_t>(m0 + i) * p.K;
    xs[i] = xp.sums.data() + static_cast<size_t>(m0 + i) * groups;
    tot[i] = _mm512_setzero_ps();
    bias[i] = 0.0f;
  }
  for (int g = 0; g < groups; ++g) {
    __m512 acc0[MT], acc1[MT];
    for (int i = 0; i < MT; ++i) {
      acc0[i] = _mm512_setzero_ps();
      acc1[i] = _mm512_setzero_ps();
    }
    for (int k = g * gs; k < (g + 1) * gs; k += 32) {
      __m512 lo, hi;
      unpack<BITS>(w, k, lo, hi);
      for (int i = 0; i < MT; ++i) {
        acc0[i] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x[i] + k), acc0[i]);
        acc1[i] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x[i] + k + 16), acc1[i]);
      }
    }
    size_t at = static_cast<size_t>(n) * groups + g;
    __m512 scale = _mm512_set1_ps(scale_at(p, p.scales, at));
    float b = scale_at(p, p.biases, at);
    for (int i = 0; i < MT; ++i) {
      tot[i] = _mm512_fmadd_ps(scale, _mm512_add_ps(acc0[i], acc1[i]), tot[i]);
      bias[i] += b * xs[i][g];
    }
  }
  for (int i = 0; i < MT; ++i) {
    p.y[static_cast<size_t>(m0 + i) * p.N + n] = _mm512_reduce_add_ps(tot[i]) + bias[i];
  }
}

// Every activation row for output row n: 8 rows a tile, then 4, 2, 1.
template <int BITS>
void rows_at(const QmmProblem& p, const Prepared& xp, int n) {
  int m = 0;
  for (; m + 8 <= p.M; m += 8) {
    tile_rows<BITS, 8>(p, xp, m, n);
  }
  if (p.M - m >= 4) {
    tile_rows<BITS, 4>(p, xp, m, n);
    m += 4;
  }
  if (p.M - m >= 2) {
    tile_rows<BITS, 2>(p, xp, m, n);
    m += 2;
  }
  if (p.M - m >= 1) {
    tile_rows<BITS, 1>(p, xp, m, n);
  }
}

template <int BITS>
void rows_bits(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  int n = n_begin;
  if (p.M == 1) {
    for (; n + 4 <= n_end; n += 4) {
      tile_decode<BITS, 4>(p, xp, n);
    }
    for (; n < n_end; ++n) {
      tile_decode<BITS, 1>(p, xp, n);
    }
    return;
  }
  for (; n < n_end; ++n) {
    rows_at<BITS>(p, xp, n);
  }
}

} // namespace

void rows_avx512(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  if (p.bits == 4) {
    rows_bits<4>(p, xp, n_begin, n_end);
  } else {
    rows_bits<8>(p, xp, n_begin, n_end);
  }
}

} // namespace vllm_mlx_kernels

#endif // __x86_64__
