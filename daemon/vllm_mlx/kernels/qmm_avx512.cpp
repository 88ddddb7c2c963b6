// The AVX-512 tiles (target attributes; qmm_kernel.cpp picks them at run time when the CPU
// and OS support AVX-512F). 4-bit weights: x is interleaved in blocks of 32
// (qmm_internal.h), so 16 bytes of weights unpack to 2 x 16 floats without shuffles.
//
// Two tiles, one arithmetic: every output is dequantized (s * q + b) chunk by chunk and
// FMA'd into one accumulator per output, reduced once, whatever the tile. So a row gets
// the same bits alone or in a batch (batch invariance; tests/unit/test_qmm_kernel.py).
// Decode (one activation row): 8 output rows at a time. Several rows (batched decode,
// short prefill): a chunk of weights for 2 output rows is unpacked and dequantized once,
// then FMA'd into 8 activation rows (or a batch's last 1-7 in one tile): 16 accumulators
// stay in the 32 vector registers, and unpacking is paid once per 8 rows instead of once
// per 4 (AVX2). How fast that runs against this core's two FMA units, and what it lost
// before: docs/benchmarks.md, round 23 (bench/qmm_tile.cpp measures a product alone).
#include "qmm_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>

#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#include "lanes_avx512.h"

namespace vllm_mlx_kernels {

namespace {

// Output rows per decode tile: 8 independent FMA chains (measured: 10.8 ms against 12.8
// ms per bundled-model decode step with 4; bench/qmm_layers.py).
constexpr int kDecodeRows = 8;

// The weights the multi-row tiles sweep per pass of activation rows: within L2 on every
// AVX-512 core (1-2 MiB), so passes after the first read them from there, not memory.
constexpr size_t kWeightBlockBytes = 256 * 1024;

// Scales (or biases) at..at+count-1 (count <= 16) as float32 into dst, 64-byte aligned.
// Each conversion is exact, so 16 at a time give the same floats as one at a time.
template <ScaleType ST>
AVX512 inline void load_scales(const void* base, size_t at, int count, float* dst) {
  if (count == 16) {
    const auto* h = static_cast<const uint16_t*>(base) + at;
    if constexpr (ST == ScaleType::f16) {
      _mm512_store_ps(dst, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h))));
      return;
    } else if constexpr (ST == ScaleType::bf16) {
      __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
      _mm512_store_ps(dst, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
      return;
    } else {
      _mm512_store_ps(dst, _mm512_loadu_ps(static_cast<const float*>(base) + at));
      return;
    }
  }
  for (int i = 0; i < count; ++i) {
    if constexpr (ST == ScaleType::f16) {
      dst[i] = _cvtsh_ss(static_cast<const uint16_t*>(base)[at + i]);
    } else if constexpr (ST == ScaleType::bf16) {
      dst[i] = bf16_to_float(static_cast<const uint16_t*>(base)[at + i]);
    } else {
      dst[i] = static_cast<const float*>(base)[at + i];
    }
  }
}

// The scales and biases of NT output rows, 16 groups at a time: converted at once into
// a buffer, then each group broadcasts its pair from memory (a load, no shuffle).
// Converting and broadcasting them one group at a time (an insert, a conversion and a
// register broadcast each, all on the shuffle port the weights' unpacking needs) was a
// third of the decode tile's instructions at groups of 32.
template <int NT, ScaleType ST>
struct GroupScales {
  alignas(64) float scale[NT][16];
  alignas(64) float bias[NT][16];

  // Before group g of output rows n0..n0+NT-1: refills the buffer every 16 groups.
  AVX512 void at_group(const QmmProblem& p, int n0, int groups, int g) {
    if ((g & 15) != 0) {
      return;
    }
    const int count = groups - g < 16 ? groups - g : 16;
    for (int j = 0; j < NT; ++j) {
      size_t at = static_cast<size_t>(n0 + j) * groups + g;
      load_scales<ST>(p.scales, at, count, scale[j]);
      load_scales<ST>(p.biases, at, count, bias[j]);
    }
  }
  AVX512 __m512 s(int j, int g) const {
    return _mm512_set1_ps(scale[j][g & 15]);
  }
  AVX512 __m512 b(int j, int g) const {
    return _mm512_set1_ps(bias[j][g & 15]);
  }
};

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

// 4-bit weights take one of 16 values per group: fma(q, s, b) for q = 0..15, the very
// operation that dequantizes each weight, so a lookup gives the same bits. vpermps reads
// only an index's low 4 bits: the low nibble needs no mask, the high one a shift. Two
// permutes replace two conversions and two FMAs per 32 weights (the decode tile is bound
// by its arithmetic, not by memory: docs/benchmarks.md).
AVX512 inline __m512 group_table(__m512 s, __m512 b) {
  const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return _mm512_fmadd_ps(q, s, b);
}

// The 32 weights of a row from k on, dequantized (s * q + b), in the order x was prepared
// in; `table` is group_table(s, b), used for 4 bits.
template <int BITS>
AVX512 inline void dequantize(const uint8_t* w, int k, __m512 s, __m512 b, __m512 table,
                              __m512& lo, __m512& hi) {
  if constexpr (BITS == 4) {
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k / 2)));
    lo = _mm512_permutexvar_ps(q, table);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
  } else {
    unpack<BITS>(w, k, lo, hi);
    lo = _mm512_fmadd_ps(lo, s, b);
    hi = _mm512_fmadd_ps(hi, s, b);
  }
}

template <int BITS>
const uint8_t* row_of(const QmmProblem& p, int n) {
  return reinterpret_cast<const uint8_t*>(p.w) + static_cast<size_t>(n) * p.K * BITS / 8;
}

// Keeps v in a register: the compiler would otherwise fold each use of a loaded x into
// its FMA as a memory operand, loading it once per output row (NT times), and the
// tile's loads then rival its FMAs for the core's two 512-bit load ports.
AVX512 inline void in_register(__m512& v) {
  __asm__("" : "+v"(v));
}

// The sums of COUNT <= 16 accumulators into out, each exactly _mm512_reduce_add_ps's
// (reduce_add16 adds the same pairs, 16 at a time: a sixth of the instructions).
template <int COUNT>
AVX512 inline void store_sums(const __m512 (&acc)[COUNT], float* out) {
  static_assert(COUNT >= 1 && COUNT <= 16, "a tile keeps at most 16 accumulators");
  __m512 all[16];
  for (int i = 0; i < 16; ++i) {
    all[i] = i < COUNT ? acc[i] : _mm512_setzero_ps();
  }
  _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << COUNT) - 1), reduce_add16(all));
}

// One activation row x output rows [n_begin, n_end), NT at a time, with exactly
// tile_rows' arithmetic per output (dequantize s * q + b, then one FMA chain over k,
// reduced once): a row gets the same bits alone or in a batch, so a sequence decoded
// alone, beside others, or re-fed after a prefix-cache hit sees identical logits and
// seeded sampling reproduces. NT 8 keeps 8 independent FMA chains in flight.
template <int BITS, int NT, ScaleType ST>
AVX512 void tile_decode(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  const int gs = p.group_size;
  const int groups = p.K / gs;
  const float* x = xp.x.data();
  const size_t group_bytes = static_cast<size_t>(gs) * BITS / 8 * NT;
  const long ahead = g_prefetch_distance.load(std::memory_order_relaxed);
  const size_t esize = ST == ScaleType::f32 ? 4 : 2;
  for (int n0 = n_begin; n0 < n_end; n0 += NT) {
    const uint8_t* w[NT];
    __m512 acc[NT];
    for (int j = 0; j < NT; ++j) {
      w[j] = row_of<BITS>(p, n0 + j);
      acc[j] = _mm512_setzero_ps();
    }
    GroupScales<NT, ST> scales;
    // The next tile's scales and biases into L2: once GroupScales converted them 16 at a
    // time, the waits on their cache misses were an eighth of this tile's samples (one
    // row: 9.40 -> 9.11 ms a step, medians of 8 alternating runs; docs/benchmarks.md,
    // round 19).
    if (ahead > 0 && n0 + 2 * NT <= p.N) {
      const size_t from = static_cast<size_t>(n0 + NT) * groups * esize;
      const size_t bytes = static_cast<size_t>(NT) * groups * esize;
      for (size_t at = 0; at < bytes; at += 64) {
        __builtin_prefetch(static_cast<const char*>(p.scales) + from + at, 0, 2);
        __builtin_prefetch(static_cast<const char*>(p.biases) + from + at, 0, 2);
      }
    }
    for (int g0 = 0; g0 < groups; g0 += 16) {
      scales.at_group(p, n0, groups, g0);
      const int g_end = std::min(groups, g0 + 16);
      for (int g = g0; g < g_end; ++g) {
        prefetch_ahead(w[0], g * group_bytes, (g + 1) * group_bytes, ahead);
        __m512 s[NT], b[NT], table[NT];
        for (int j = 0; j < NT; ++j) {
          s[j] = scales.s(j, g);
          b[j] = scales.b(j, g);
          table[j] = group_table(s[j], b[j]);
        }
        for (int k = g * gs; k < (g + 1) * gs; k += 32) {
          __m512 xl = _mm512_loadu_ps(x + k), xh = _mm512_loadu_ps(x + k + 16);
          for (int j = 0; j < NT; ++j) {
            __m512 lo, hi;
            dequantize<BITS>(w[j], k, s[j], b[j], table[j], lo, hi);
            acc[j] = _mm512_fmadd_ps(lo, xl, acc[j]);
            acc[j] = _mm512_fmadd_ps(hi, xh, acc[j]);
          }
        }
      }
    }
    store_sums(acc, p.y + n0);
  }
}

// Activation rows [m0, m0 + MT) x output rows [n_begin, n_end), NT output rows at a time
// (n_end - n_begin a multiple of NT). The loop over output rows is in here, not around
// the call: a call's fixed costs (the group count's division, the activations' pointer,
// spilling the accumulators) were a fifth of a 2-output tile over 576 inputs.
template <int BITS, int MT, int NT, ScaleType ST>
AVX512 void tile_rows(const QmmProblem& p, const Prepared& xp, int m0, int n_begin, int n_end) {
  const int gs = p.group_size;
  const int groups = p.K / gs;
  // Row i of the tile's activations at x + i * K: one pointer, not MT (the general
  // registers hold the weights' pointers and the loop's counters too).
  const float* x = xp.x.data() + static_cast<size_t>(m0) * p.K;
  const size_t K = static_cast<size_t>(p.K);
  const size_t group_bytes = static_cast<size_t>(gs) * BITS / 8 * NT;
  // Only the first pass over these output rows reads them from memory (later activation
  // rows find them in cache), and from 4 activation rows on the tile is bound by its
  // arithmetic: prefetching there only cost time (8 rows: 4-6% slower per product).
  const bool streams = MT <= 2 && m0 == 0;
  const long ahead = streams ? g_prefetch_distance.load(std::memory_order_relaxed) : 0;
  for (int n0 = n_begin; n0 < n_end; n0 += NT) {
    const uint8_t* w[NT];
    for (int j = 0; j < NT; ++j) {
      w[j] = row_of<BITS>(p, n0 + j);
    }
    __m512 acc[MT * NT];
    for (int a = 0; a < MT * NT; ++a) {
      acc[a] = _mm512_setzero_ps();
    }
    GroupScales<NT, ST> scales;
    for (int g0 = 0; g0 < groups; g0 += 16) {
      scales.at_group(p, n0, groups, g0);
      const int g_end = std::min(groups, g0 + 16);
      for (int g = g0; g < g_end; ++g) {
        prefetch_ahead(w[0], g * group_bytes, (g + 1) * group_bytes, ahead);
        __m512 s[NT], b[NT], table[NT];
        for (int j = 0; j < NT; ++j) {
          s[j] = scales.s(j, g);
          b[j] = scales.b(j, g);
          table[j] = group_table(s[j], b[j]);
        }
        for (int k = g * gs; k < (g + 1) * gs; k += 32) {
          __m512 lo[NT], hi[NT];
          for (int j = 0; j < NT; ++j) {
            dequantize<BITS>(w[j], k, s[j], b[j], table[j], lo[j], hi[j]);
          }
          for (int i = 0; i < MT; ++i) {
            __m512 xl = _mm512_loadu_ps(x + i * K + k);
            __m512 xh = _mm512_loadu_ps(x + i * K + k + 16);
            in_register(xl);
            in_register(xh);
            for (int j = 0; j < NT; ++j) {
              acc[i * NT + j] = _mm512_fmadd_ps(lo[j], xl, acc[i * NT + j]);
              acc[i * NT + j] = _mm512_fmadd_ps(hi[j], xh, acc[i * NT + j]);
            }
          }
        }
      }
    }
    alignas(64) float sums[16];
    store_sums(acc, sums);
    for (int i = 0; i < MT; ++i) {
      for (int j = 0; j < NT; ++j) {
        p.y[static_cast<size_t>(m0 + i) * p.N + n0 + j] = sums[i * NT + j];
      }
    }
  }
}

// Output rows [n_begin, n_end) for activation rows [m, m + MT), two output rows a tile.
template <int BITS, int MT, ScaleType ST>
void rows_of_tile(const QmmProblem& p, const Prepared& xp, int m, int n_begin, int n_end) {
  const int pairs_end = n_begin + (n_end - n_begin) / 2 * 2;
  tile_rows<BITS, MT, 2, ST>(p, xp, m, n_begin, pairs_end);
  if (pairs_end < n_end) {
    tile_rows<BITS, MT, 1, ST>(p, xp, m, pairs_end, n_end);
  }
}

template <int BITS, ScaleType ST>
void rows_typed(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  int n = n_begin;
  if (p.M == 1) {
    const int tiles_end = n + (n_end - n) / kDecodeRows * kDecodeRows;
    tile_decode<BITS, kDecodeRows, ST>(p, xp, n, tiles_end);
    tile_decode<BITS, 1, ST>(p, xp, tiles_end, n_end);
    return;
  }
  // Output rows in blocks whose weights fit in L2, and within a block 8 activation rows
  // at a time across every output row, then the rest: a tile's activations (8 rows of K
  // floats) stay in L1 while the block's weights stream past them, from L2 after the
  // first 8 rows. Output rows outermost re-read every activation row for each pair of
  // output rows, from L2 once they outgrew L1 (16 rows of 576 floats and more): the tile
  // then waited on L2 for a third of its time.
  const size_t row_bytes = static_cast<size_t>(p.K) * BITS / 8;
  const int block = std::max<int>(2, static_cast<int>(kWeightBlockBytes / row_bytes) & ~1);
  for (int nb = n_begin; nb < n_end; nb += block) {
    const int ne = std::min(n_end, nb + block);
    int m = 0;
    for (; m + 8 <= p.M; m += 8) {
      rows_of_tile<BITS, 8, ST>(p, xp, m, nb, ne);
    }
    // The last 1-7 rows in one tile: each weight is unpacked once for all of them (as
    // 4 + 2 + 1 tiles, 7 rows unpacked it three times: 24 of a step's 52 instructions).
    switch (p.M - m) {
      case 7: rows_of_tile<BITS, 7, ST>(p, xp, m, nb, ne); break;
      case 6: rows_of_tile<BITS, 6, ST>(p, xp, m, nb, ne); break;
      case 5: rows_of_tile<BITS, 5, ST>(p, xp, m, nb, ne); break;
      case 4: rows_of_tile<BITS, 4, ST>(p, xp, m, nb, ne); break;
      case 3: rows_of_tile<BITS, 3, ST>(p, xp, m, nb, ne); break;
      case 2: rows_of_tile<BITS, 2, ST>(p, xp, m, nb, ne); break;
      case 1: rows_of_tile<BITS, 1, ST>(p, xp, m, nb, ne); break;
      default: break;
    }
  }
}

template <int BITS>
void rows_bits(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  switch (p.scale_type) {
    case ScaleType::f32: rows_typed<BITS, ScaleType::f32>(p, xp, n_begin, n_end); break;
    case ScaleType::f16: rows_typed<BITS, ScaleType::f16>(p, xp, n_begin, n_end); break;
    case ScaleType::bf16: rows_typed<BITS, ScaleType::bf16>(p, xp, n_begin, n_end); break;
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
