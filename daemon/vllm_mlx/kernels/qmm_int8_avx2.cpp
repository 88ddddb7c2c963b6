// The int8 tiles on AVX2 (a model's `int8_activations: true` on a CPU without AVX-512
// VNNI: Zen 2/3, Intel before Ice Lake): the activations and lanes of qmm_vnni.cpp
// (qmm_int8.h), each 64-byte chunk taken as two 32-byte halves.
//
// AVX2 has no vpdpbusd. vpmaddubsw multiplies unsigned weight bytes by signed activation
// bytes and adds adjacent pairs into saturating int16; vpmaddwd by ones then adds pairs of
// those into the int32 lanes vpdpbusd would give. Saturation is what shapes the rest:
// - 4 bits: a pair is at most 2 x 15 x 127 = 3,810, and the low and high nibbles' pairs
//   are added in int16 (7,620) before the widening: exact.
// - 8 bits: 2 x 255 x 127 = 64,770 would saturate. The weights are taken as signed,
//   q - 128 (one XOR), and multiplied as |q - 128| times x with q - 128's sign moved onto
//   x (vpsignb), as llama.cpp does: at most 2 x 128 x 127 = 32,512, exact. The 128 s q
//   taken off comes back in the bias term: b + 128 s per group.
// The float work is as in the VNNI tiles: each lane's sum times its weight scale and its
// activation scale, every output the same sequence of operations whatever the tile.
#include "qmm_int8.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>

namespace vllm_mlx_kernels {

namespace {

#define AVX2 __attribute__((target("avx2,fma,f16c")))

// Lane l of half h's weight group relative to the chunk's first: its first weight's
// offset (int8_lane_offset) shifted by log2 of the group size. A shift, not a division:
// 16 integer divisions in a tile's setup cost as much as a 576-wide tile's products.
AVX2 inline __m256i group_index(int bits, int group_shift, int half) {
  const __m256i lane = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                        _mm256_set1_epi32(8 * half));
  const __m256i offset = _mm256_mullo_epi32(lane, _mm256_set1_epi32(int8_lane_offset(bits, 1)));
  return _mm256_srl_epi32(offset, _mm_cvtsi32_si128(group_shift));
}

// Scales (or biases) [at, at + 8) of a row as floats; past the `count` that exist, zeros.
// Reads up to 8 values in one load where the array (`total` values) has them, the next
// row's zeroed, so that an infinity there cannot make a NaN; only the array's last few
// go one by one.
template <ScaleType ST>
AVX2 inline __m256 load8(const void* base, size_t at, int count, size_t total) {
  if (count < 8 && at + 8 > total) {
    alignas(32) float part[8] = {};
    for (int i = 0; i < count; ++i) {
      if constexpr (ST == ScaleType::f32) {
        part[i] = static_cast<const float*>(base)[at + i];
      } else if constexpr (ST == ScaleType::f16) {
        part[i] = _cvtsh_ss(static_cast<const uint16_t*>(base)[at + i]);
      } else {
        part[i] = bf16_to_float(static_cast<const uint16_t*>(base)[at + i]);
      }
    }
    return _mm256_load_ps(part);
  }
  __m256 v;
  if constexpr (ST == ScaleType::f32) {
    v = _mm256_loadu_ps(static_cast<const float*>(base) + at);
  } else {
    const uint16_t* half_floats = static_cast<const uint16_t*>(base) + at;
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(half_floats));
    if constexpr (ST == ScaleType::f16) {
      v = _mm256_cvtph_ps(h);
    } else {
      v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
  if (count < 8) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 kept = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(count), lanes));
    v = _mm256_and_ps(v, kept);
  }
  return v;
}

// The bias term's weight offsets: b, or b + 128 s for 8 bits (the weights multiplied as
// q - 128).
template <int BITS, ScaleType ST>
AVX2 inline __m256 load_offsets(const QmmProblem& p, size_t at, int count, size_t total) {
  __m256 b = load8<ST>(p.biases, at, count, total);
  if constexpr (BITS == 8) {
    b = _mm256_fmadd_ps(load8<ST>(p.scales, at, count, total), _mm256_set1_ps(128.0f), b);
  }
  return b;
}

AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// MT activation rows x NT output rows, every chunk of K. Each output row's scales are read
// 8 groups at a time (its "window"); a half's lanes pick theirs by one permute.
template <int BITS, ScaleType ST, int MT, int NT>
AVX2 void tile(const QmmProblem& p, const PreparedInt8& xp, int m0, int n0) {
  const int groups = p.K / p.group_size;
  const size_t total = static_cast<size_t>(p.N) * groups; // scales (biases) in the array
  const size_t row_bytes = static_cast<size_t>(p.K) * BITS / 8;
  const int per_chunk = BITS == 4 ? 128 : 64; // weights in 64 bytes
  const int group_shift = __builtin_ctz(static_cast<unsigned>(p.group_size)); // 32, 64, 128
  const __m256i lane_group[2] = {group_index(BITS, group_shift, 0),
                                 group_index(BITS, group_shift, 1)};
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const uint8_t* w[NT];
  for (int j = 0; j < NT; ++j) {
    w[j] = reinterpret_cast<const uint8_t*>(p.w) + static_cast<size_t>(n0 + j) * row_bytes;
  }
  __m256 acc[MT][NT];
  for (int i = 0; i < MT; ++i) {
    for (int j = 0; j < NT; ++j) {
      acc[i][j] = _mm256_setzero_ps();
    }
  }
  __m256 window[NT];
  int window_at = -8;
  alignas(32) uint8_t tail[NT][32]; // a row's last half-chunk cut short, zero-padded
  const long ahead = m0 == 0 ? g_prefetch_distance.load(std::memory_order_relaxed) : 0;
  for (int c = 0; c < xp.chunks; ++c) {
    const size_t at = static_cast<size_t>(c) * 64;
    prefetch_ahead(w[0], at * NT, (at + 64) * NT, ahead);
    const size_t left = row_bytes - at;
    const int g0 = (c * per_chunk) >> group_shift; // the chunk's first group
    if (g0 >= window_at + 8) { // chunks never straddle windows: 8 is a multiple of theirs
      window_at = g0;
      for (int j = 0; j < NT; ++j) {
        const size_t row = static_cast<size_t>(n0 + j) * groups;
        window[j] = load8<ST>(p.scales, row + g0, groups - g0, total);
      }
    }
    // A row's last chunk may end inside or before its second half (4 bits, K = 576: 288
    // bytes, the last chunk 32): a half past the row's end is all padding (x and its
    // scales are zero there) and is skipped, 1 chunk in 9 of such a row's work; a half
    // cut short (K not a multiple of 64 at 4 bits) is read from a zero-padded copy.
    const int halves = left >= 64 ? 2 : static_cast<int>((left + 31) / 32);
    for (int half = 0; half < halves; ++half) {
      const bool short_half = left < static_cast<size_t>(32 * (half + 1));
      const __m256i index = _mm256_add_epi32(lane_group[half], _mm256_set1_epi32(g0 - window_at));
      __m256i xa[MT], xb[MT];
      __m256 dx[MT];
      for (int i = 0; i < MT; ++i) {
        const size_t chunk = static_cast<size_t>(m0 + i) * xp.chunks + c;
        const int8_t* q = xp.q.data() + chunk * xp.chunk_bytes + 32 * half;
        xa[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
        if constexpr (BITS == 4) {
          xb[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64));
        }
        dx[i] = _mm256_loadu_ps(xp.dx.data() + chunk * 16 + 8 * half);
      }
      for (int j = 0; j < NT; ++j) {
        const uint8_t* src = w[j] + at + 32 * half;
        if (short_half) {
          std::memset(tail[j], 0, 32);
          std::memcpy(tail[j], src, left - 32 * half);
          src = tail[j];
        }
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
        const __m256 s = _mm256_permutevar8x32_ps(window[j], index);
        __m256i lo, hi, mag;
        if constexpr (BITS == 4) {
          lo = _mm256_and_si256(raw, nibble);
          hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble);
        } else {
          lo = _mm256_xor_si256(raw, flip); // q - 128 as a signed byte
          mag = _mm256_abs_epi8(lo);
        }
        for (int i = 0; i < MT; ++i) {
          __m256i pairs;
          if constexpr (BITS == 4) {
            pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa[i]),
                                     _mm256_maddubs_epi16(hi, xb[i]));
          } else {
            pairs = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(xa[i], lo));
          }
          const __m256i dot = _mm256_madd_epi16(pairs, ones);
          acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(s, dx[i]), acc[i][j]);
        }
      }
    }
  }
  // The bias term, sum over groups of the offsets times the rounded x's sum over the
  // group, joins the lanes before the one reduction per output.
  for (int g = 0; g < groups; g += 8) {
    const int count = groups - g;
    for (int j = 0; j < NT; ++j) {
      const size_t row = static_cast<size_t>(n0 + j) * groups;
      const __m256 b = load_offsets<BITS, ST>(p, row + g, count, total);
      for (int i = 0; i < MT; ++i) {
        const size_t at = static_cast<size_t>(m0 + i) * groups + g;
        const __m256 sums = load8<ScaleType::f32>(xp.sums.data(), at, count, xp.sums.size());
        acc[i][j] = _mm256_fmadd_ps(b, sums, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MT; ++i) {
    for (int j = 0; j < NT; ++j) {
      p.y[static_cast<size_t>(m0 + i) * p.N + n0 + j] = hsum(acc[i][j]);
    }
  }
}

struct Avx2Int8Tiles {
  // 4, not the VNNI set's 8: 16 ymm registers hold 4 rows' sums and scale windows, 8
  // spill (Zen 3, 1B-model shapes, one row: 4-bit 1.50 ms against 1.79, 8-bit 3.12
  // against 3.68; docs/benchmarks.md "Round 11").
  static constexpr int kDecodeRows = 4;
  // Batches: 4 activation rows x 4 outputs, as the VNNI set, though the 16 sums spill
  // (16 rows at 1B-model shapes, one thread: 4-bit 16.4 ms against 18.1 with 4 x 2 and
  // 20.2 with 4 x 1; 8-bit 29.0 against 30.8 and 31.2).
  static constexpr int kBatchOutputs = 4;
  template <int BITS, ScaleType ST, int MT, int NT>
  static void run(const QmmProblem& p, const PreparedInt8& xp, int m0, int n0) {
    tile<BITS, ST, MT, NT>(p, xp, m0, n0);
  }
};

// 8 activations times 127 / max|x|, rounded to nearest even (the default MXCSR rounding,
// as the VNNI set's conversion), clamped to [-127, 127].
AVX2 inline __m256i round8(__m256 v, __m256 inv) {
  __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(v, inv));
  return _mm256_min_epi32(_mm256_max_epi32(r, _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
}

// One block of 32 activations to int8 (scale max|x| / 127), the same bytes the VNNI set
// writes; its scale is returned. A NaN or an infinity gives garbage values, never a fault.
AVX2 float quantize_block(const float* src, int8_t* out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(src + 8 * k);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float top = _mm_cvtss_f32(m);
  const __m256 inv = _mm256_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
  // Packing interleaves 128-bit lanes: the 4-byte groups come out as 0 2 4 6 1 3 5 7 of
  // the wanted order's 0..7 (group k: values 4k..4k+3); one permute puts them back.
  const __m256i words01 = _mm256_packs_epi32(round8(v[0], inv), round8(v[1], inv));
  const __m256i words23 = _mm256_packs_epi32(round8(v[2], inv), round8(v[3], inv));
  const __m256i bytes = _mm256_packs_epi16(words01, words23);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutevar8x32_epi32(bytes, order));
  return top / 127.0f;
}

} // namespace

void prepare_int8_avx2(const QmmProblem& p, PreparedInt8& out) {
  prepare_int8_with(p, out, quantize_block);
}

void rows_int8_avx2(const QmmProblem& p, const PreparedInt8& xp, int n_begin, int n_end) {
  rows_int8_with<Avx2Int8Tiles>(p, xp, n_begin, n_end);
}

} // namespace vllm_mlx_kernels

#endif // __x86_64__
