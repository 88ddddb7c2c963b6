// The AVX2/FMA/F16C tiles (compiled per function with target attributes, chosen at run
// time by qmm_kernel.cpp). 4-bit weights: x is interleaved in blocks of 16 (qmm_internal.h).
#include "qmm_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace vllm_mlx_kernels {

namespace {

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One scale or bias as float32, converted in the tile's loop (no pass over the row).
template <ScaleType ST>
AVX2 inline float load_scale(const void* base, size_t i) {
  if constexpr (ST == ScaleType::f32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (ST == ScaleType::f16) {
    return _cvtsh_ss(static_cast<const uint16_t*>(base)[i]);
  } else {
    return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  }
}

// Scales (or biases) at..at+count-1 (count <= 8) as float32 into dst: exact for each
// type, so converting 8 at a time gives the same floats as load_scale one by one.
template <ScaleType ST>
AVX2 inline void load_scales(const void* base, size_t at, int count, float* dst) {
  if constexpr (ST == ScaleType::f16) {
    if (count == 8) {
      const auto* h = static_cast<const uint16_t*>(base) + at;
      _mm256_storeu_ps(dst, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h))));
      return;
    }
  }
  for (int i = 0; i < count; ++i) {
    dst[i] = load_scale<ST>(base, at + i);
  }
}

// A tile of MT activation rows x NT output rows. Per chunk of 16 weights: unpack once,
// FMA into every activation row; two accumulators per pair so FMA latency overlaps.
template <int BITS, int MT, int NT, ScaleType ST>
AVX2 void tile_avx2(const QmmProblem& p, const Prepared& xp, int m0, int n0) {
  const int K = p.K;
  const int gs = p.group_size;
  const int groups = K / gs;
  const uint8_t* w[NT];
  for (int j = 0; j < NT; ++j) {
    w[j] = reinterpret_cast<const uint8_t*>(p.w) + static_cast<size_t>(n0 + j) * K * BITS / 8;
  }
  const float* x[MT];
  const float* xs[MT];
  for (int i = 0; i < MT; ++i) {
    x[i] = xp.x.data() + static_cast<size_t>(m0 + i) * K;
    xs[i] = xp.sums.data() + static_cast<size_t>(m0 + i) * groups;
  }
  __m256 tot[MT][NT];
  float bias[MT][NT];
  for (int i = 0; i < MT; ++i) {
    for (int j = 0; j < NT; ++j) {
      tot[i][j] = _mm256_setzero_ps();
      bias[i][j] = 0.0f;
    }
  }
  const __m256i low4 = _mm256_set1_epi32(0xf);
  const size_t group_bytes = static_cast<size_t>(gs) * BITS / 8 * NT;
  // A tile of one output row (several activation rows) reads it in order: no prefetch.
  const long ahead = NT > 1 ? g_prefetch_distance.load(std::memory_order_relaxed) : 0;
  // At one activation row, the next 8 groups' scales and biases of each output row,
  // converted at once: a group of 32 weights is two steps of the loop below, and its
  // scalar conversions were a large share of it. Tiles of several rows keep the
  // conversion per group (the buffer measured 1.1x slower there: register pressure).
  constexpr bool batched = MT == 1;
  alignas(32) float scale_at[NT][8];
  alignas(32) float bias_at[NT][8];
  for (int g = 0; g < groups; ++g) {
    prefetch_ahead(w[0], g * group_bytes, (g + 1) * group_bytes, ahead);
    const int slot = g & 7;
    if (batched && slot == 0) {
      const int count = groups - g < 8 ? groups - g : 8;
      for (int j = 0; j < NT; ++j) {
        size_t at = static_cast<size_t>(n0 + j) * groups + g;
        load_scales<ST>(p.scales, at, count, scale_at[j]);
        load_scales<ST>(p.biases, at, count, bias_at[j]);
      }
    }
    __m256 acc0[MT][NT], acc1[MT][NT];
    for (int i = 0; i < MT; ++i) {
      for (int j = 0; j < NT; ++j) {
        acc0[i][j] = _mm256_setzero_ps();
        acc1[i][j] = _mm256_setzero_ps();
      }
    }
    for (int k = g * gs; k < (g + 1) * gs; k += 16) {
      for (int j = 0; j < NT; ++j) {
        __m256 lo, hi;
        if constexpr (BITS == 4) {
          __m256i q = _mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[j] + k / 2)));
          lo = _mm256_cvtepi32_ps(_mm256_and_si256(q, low4));
          hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4));
        } else {
          lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[j] + k))));
          hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[j] + k + 8))));
        }
        for (int i = 0; i < MT; ++i) {
          acc0[i][j] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x[i] + k), acc0[i][j]);
          acc1[i][j] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x[i] + k + 8), acc1[i][j]);
        }
      }
    }
    for (int j = 0; j < NT; ++j) {
      size_t at = static_cast<size_t>(n0 + j) * groups + g;
      __m256 scale = batched ? _mm256_broadcast_ss(&scale_at[j][slot])
                             : _mm256_set1_ps(load_scale<ST>(p.scales, at));
      float b = batched ? bias_at[j][slot] : load_scale<ST>(p.biases, at);
      for (int i = 0; i < MT; ++i) {
        tot[i][j] = _mm256_fmadd_ps(scale, _mm256_add_ps(acc0[i][j], acc1[i][j]), tot[i][j]);
        bias[i][j] += b * xs[i][g];
      }
    }
  }
  for (int i = 0; i < MT; ++i) {
    for (int j = 0; j < NT; ++j) {
      p.y[static_cast<size_t>(m0 + i) * p.N + n0 + j] = hsum(tot[i][j]) + bias[i][j];
    }
  }
}

struct Avx2Tiles {
  template <int BITS, int MT, int NT, ScaleType ST>
  static void run(const QmmProblem& p, const Prepared& xp, int m0, int n0) {
    tile_avx2<BITS, MT, NT, ST>(p, xp, m0, n0);
  }
};

} // namespace

void rows_avx2(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  rows_with_tiles<Avx2Tiles>(p, xp, n_begin, n_end);
}

} // namespace vllm_mlx_kernels

#endif // __x86_64__
