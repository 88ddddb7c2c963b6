// Opt-in int8 activations (a model's `int8_activations: true`): x is quantized to int8 per
// 32 values, as llama.cpp's Q8 activations are, and multiplied by the packed weights with
// AVX-512 VNNI's vpdpbusd (64 unsigned-weight x signed-activation byte products a
// instruction, summed in 32-bit lanes).
//
// Why: the exact tiles (qmm_avx512.cpp) turn every weight into a float by table lookups,
// three shuffles per 32 weights, and on a CPU that splits 512-bit shuffles in two (Zen 4)
// those bound a decode step. Here 128 4-bit weights cost two ANDs, a shift and two
// vpdpbusd per activation row, and the float work is once per 128 weights: the lane sums
// times (weight scale x activation scale). The product differs from the exact one by the
// activations' rounding (relative error ~5e-3, tests/unit/test_qmm_int8.py), which is
// why it is a choice, not the default.
//
// A chunk is 64 bytes of a weight row: 128 weights at 4 bits, 64 at 8. Lane L of a
// vpdpbusd sums bytes 4L..4L+3, i.e. weights 8L..8L+7 (4 bits: low nibbles against the
// even activations, high nibbles against the odd ones) or 4L..4L+3 (8 bits), which lie in
// one 32-value activation block and one weight group: each lane's sum is scaled once by
// its own s * dx. Every output is the same sequence of operations whatever the tile, so a
// row gets the same bits alone or in a batch.
#include "qmm_int8.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace vllm_mlx_kernels {

namespace {

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

// Lane L's weight group relative to the chunk's first: its first weight's offset
// (int8_lane_offset) shifted by log2 of the group size; a shift, not 16 divisions in
// every tile's setup.
VNNI inline __m512i group_index(int bits, int group_shift) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i offset = _mm512_mullo_epi32(lane, _mm512_set1_epi32(int8_lane_offset(bits, 1)));
  return _mm512_srl_epi32(offset, _mm_cvtsi32_si128(group_shift));
}

// Scales (or biases) [at, at + 16) of a row as floats, masked to the `count` that exist
// (no read past the row's last group).
template <ScaleType ST>
VNNI inline __m512 load16(const void* base, size_t at, int count) {
  __mmask16 mask = static_cast<__mmask16>(count >= 16 ? 0xffff : (1u << count) - 1);
  if constexpr (ST == ScaleType::f32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + at);
  } else {
    __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + at);
    if constexpr (ST == ScaleType::f16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

// MT activation rows x NT output rows, every chunk of K. Each output row's scales are
// read 16 groups at a time into a register (its "window"); a chunk's lanes pick theirs
// from it by one permute, the same index for every row.
template <int BITS, ScaleType ST, int MT, int NT>
VNNI void tile(const QmmProblem& p, const PreparedInt8& xp, int m0, int n0) {
  const int groups = p.K / p.group_size;
  const size_t row_bytes = static_cast<size_t>(p.K) * BITS / 8;
  const int per_chunk = BITS == 4 ? 128 : 64; // weights in 64 bytes
  const int group_shift = __builtin_ctz(static_cast<unsigned>(p.group_size)); // 32, 64, 128
  const __m512i lane_group = group_index(BITS, group_shift);
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  const uint8_t* w[NT];
  for (int j = 0; j < NT; ++j) {
    w[j] = reinterpret_cast<const uint8_t*>(p.w) + static_cast<size_t>(n0 + j) * row_bytes;
  }
  __m512 acc[MT][NT];
  for (int i = 0; i < MT; ++i) {
    for (int j = 0; j < NT; ++j) {
      acc[i][j] = _mm512_setzero_ps();
    }
  }
  __m512 window[NT];
  int window_at = -16;
  // Only the first pass over these output rows reads them from memory; later activation
  // rows find them in cache.
  const long ahead = m0 == 0 ? g_prefetch_distance.load(std::memory_order_relaxed) : 0;
  for (int c = 0; c < xp.chunks; ++c) {
    const size_t at = static_cast<size_t>(c) * 64;
    prefetch_ahead(w[0], at * NT, (at + 64) * NT, ahead);
    const size_t left = row_bytes - at;
    const __mmask64 bytes = left >= 64 ? ~0ULL : (1ULL << left) - 1;
    const int g0 = (c * per_chunk) >> group_shift; // the chunk's first group
    if (g0 >= window_at + 16) { // chunks never straddle windows: 16 is a multiple of theirs
      window_at = g0;
      for (int j = 0; j < NT; ++j) {
        window[j] = load16<ST>(p.scales, static_cast<size_t>(n0 + j) * groups + g0, groups - g0);
      }
    }
    const __m512i index = _mm512_add_epi32(lane_group, _mm512_set1_epi32(g0 - window_at));
    __m512i xa[MT], xb[MT];
    __m512 dx[MT];
    for (int i = 0; i < MT; ++i) {
      const int8_t* q = xp.q.data() + (static_cast<size_t>(m0 + i) * xp.chunks + c) * xp.chunk_bytes;
      xa[i] = _mm512_loadu_si512(q);
      if constexpr (BITS == 4) {
        xb[i] = _mm512_loadu_si512(q + 64);
      }
      dx[i] = _mm512_loadu_ps(xp.dx.data() + (static_cast<size_t>(m0 + i) * xp.chunks + c) * 16);
    }
    for (int j = 0; j < NT; ++j) {
      __m512i raw = _mm512_maskz_loadu_epi8(bytes, w[j] + at);
      __m512i lo = BITS == 4 ? _mm512_and_si512(raw, nibble) : raw;
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
      __m512 s = _mm512_permutexvar_ps(index, window[j]);
      for (int i = 0; i < MT; ++i) {
        __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xa[i]);
        if constexpr (BITS == 4) {
          dot = _mm512_dpbusd_epi32(dot, hi, xb[i]);
        }
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, dx[i]), acc[i][j]);
      }
    }
  }
  // The bias term, sum over groups of b[n, g] * (the rounded x's sum over g), joins the lanes
  // before the one reduction per output.
  for (int g = 0; g < groups; g += 16) {
    for (int j = 0; j < NT; ++j) {
      __m512 b = load16<ST>(p.biases, static_cast<size_t>(n0 + j) * groups + g, groups - g);
      for (int i = 0; i < MT; ++i) {
        const float* sums = xp.sums.data() + static_cast<size_t>(m0 + i) * groups + g;
        __mmask16 mask = static_cast<__mmask16>(groups - g >= 16 ? 0xffff : (1u << (groups - g)) - 1);
        acc[i][j] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(mask, sums), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MT; ++i) {
    for (int j = 0; j < NT; ++j) {
      p.y[static_cast<size_t>(m0 + i) * p.N + n0 + j] = _mm512_reduce_add_ps(acc[i][j]);
    }
  }
}

struct VnniTiles {
  // 8 (against 1 and 2, and software prefetching of the next tile: no better beyond noise
  // on Zen 4; docs/benchmarks.md).
  static constexpr int kDecodeRows = 8;
  // Batches: 4 activation rows x 4 outputs (16 rows of the bundled model: 50.4-51.1 ms a
  // step against 53.3-53.4 with 4 x 2, 55.5-56.1 with 8 x 2, 58.3 with 2 x 4, 61.5-61.8
  // with 8 x 1; bench/qmm_layers.py, one thread, Zen 4).
  static constexpr int kBatchOutputs = 4;
  template <int BITS, ScaleType ST, int MT, int NT>
  static void run(const QmmProblem& p, const PreparedInt8& xp, int m0, int n0) {
    tile<BITS, ST, MT, NT>(p, xp, m0, n0);
  }
};

// 16 activations times 127 / max|x|, rounded to nearest even, clamped to [-127, 127].
VNNI inline __m128i round16(__m512 v, __m512 inv) {
  __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
  r = _mm512_min_epi32(_mm512_max_epi32(r, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
  return _mm512_cvtsepi32_epi8(r);
}

// One block of 32 activations to int8 (scale max|x| / 127); its scale is returned. A NaN
// or an infinity gives garbage values, clamped, never a fault.
VNNI float quantize_block(const float* src, int8_t* out) {
  __m512 a = _mm512_loadu_ps(src), b = _mm512_loadu_ps(src + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), round16(a, inv));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), round16(b, inv));
  return amax / 127.0f;
}

} // namespace

void prepare_int8_vnni(const QmmProblem& p, PreparedInt8& out) {
  prepare_int8_with(p, out, quantize_block);
}

void rows_int8_vnni(const QmmProblem& p, const PreparedInt8& xp, int n_begin, int n_end) {
  rows_int8_with<VnniTiles>(p, xp, n_begin, n_end);
}

} // namespace vllm_mlx_kernels

#endif // __x86_64__
