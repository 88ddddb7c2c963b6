// The AVX2/FMA/F16C tiles (compiled per function with target attributes, chosen at run
// time by qmm_kernel.cpp). 4-bit weights: x is interleaved in blocks of 8 (qmm_internal.h),
// so 8 bytes of weights unpack to the 8 low nibbles, then the 8 high ones.
//
// The AVX-512 tiles' arithmetic, 8 lanes wide: every weight is dequantized (s * q + b) and
// FMA'd into one accumulator per output, reduced once, whatever the tile. So a row gets the
// same bits alone or in a batch (batch invariance; tests/unit/test_qmm_kernel.py). A tile
// is MT activation rows x NT output rows with 8 accumulators where the rows allow (1 x 4
// decoding one sequence, 2 x 4, 3 x 4, 4-5 x 2): each output row's 16 weights are
// dequantized once for all MT rows. From 6 rows on (rows_dequantized), 3 output rows are
// dequantized into a buffer in L1 at a time and multiplied in float blocks of 4 rows x 3
// outputs, the same FMAs in the same order.
//
// Before (round 11), the tiles summed q * x over a group and scaled the sum
// (s * sum(q * x) + b * sum(x)): no dequantizing FMAs, but every group of 32 weights ended
// in a reduction of two accumulators, an FMA into a third and a scalar bias term per row
// and output, so three registers per row and output and tiles of 4 rows: 17.6 GFMA/s at
// 16 rows, one core of an Intel Xeon whose 256-bit FMAs peak at 55 (docs/benchmarks.md,
// round 25). Only the 4-bit weights' unpacking is shared with that form; the bits differ.
#include "qmm_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>

namespace vllm_mlx_kernels {

namespace {

#define AVX2 __attribute__((target("avx2,fma,f16c")))

// From this many activation rows on, output rows are dequantized into a buffer first
// (rows_dequantized), kBlockOutputs at a time: 4 x 3 blocks of accumulators. At 4-5 rows
// the tiles were as fast or faster, from 6 on slower (bench/qmm_tile.cpp, round 25).
constexpr int kDequantizedRows = 6;
constexpr int kBlockOutputs = 3;

// The weights the multi-row tiles sweep per pass of activation rows: within L2 on every
// AVX2 core (256 KiB and up), so passes after the first read them from there.
constexpr size_t kWeightBlockBytes = 128 * 1024;

AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Scales (or biases) at..at+count-1 (count <= 8) as float32 into dst, 32-byte aligned.
// Each conversion is exact, so 8 at a time give the same floats as one at a time.
template <ScaleType ST>
AVX2 inline void load_scales(const void* base, size_t at, int count, float* dst) {
  if (count == 8) {
    const auto* h = static_cast<const uint16_t*>(base) + at;
    if constexpr (ST == ScaleType::f16) {
      _mm256_store_ps(dst, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h))));
    } else if constexpr (ST == ScaleType::bf16) {
      __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
      _mm256_store_ps(dst, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
    } else {
      _mm256_store_ps(dst, _mm256_loadu_ps(static_cast<const float*>(base) + at));
    }
    return;
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

// The scales and biases of NT output rows, 8 groups at a time: converted at once into a
// buffer, then each group broadcasts its pair from memory (a load, no shuffle). AVX-512's
// is the same with 16 groups and 16-lane broadcasts.
template <int NT, ScaleType ST>
struct GroupScales {
  alignas(32) float scale[NT][8];
  alignas(32) float bias[NT][8];

  // Before group g of output rows n0..n0+NT-1: refills the buffer every 8 groups.
  AVX2 void at_group(const QmmProblem& p, int n0, int groups, int g) {
    if ((g & 7) != 0) {
      return;
    }
    const int count = groups - g < 8 ? groups - g : 8;
    for (int j = 0; j < NT; ++j) {
      load_scales<ST>(p.scales, static_cast<size_t>(n0 + j) * groups + g, count, scale[j]);
      load_scales<ST>(p.biases, static_cast<size_t>(n0 + j) * groups + g, count, bias[j]);
    }
  }
  AVX2 __m256 s(int j, int g) const {
    return _mm256_broadcast_ss(&scale[j][g & 7]);
  }
  AVX2 __m256 b(int j, int g) const {
    return _mm256_broadcast_ss(&bias[j][g & 7]);
  }
};

// The 16 weights of a row from k on as floats (q, not yet scaled), in the order x was
// prepared in: for 4 bits the 8 low nibbles, then the 8 high ones; for 8 bits bytes
// k..k+7, then k+8..k+15.
template <int BITS>
AVX2 inline void unpack(const uint8_t* w, int k, __m256i low4, __m256& lo, __m256& hi) {
  if constexpr (BITS == 4) {
    __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k / 2)));
    lo = _mm256_cvtepi32_ps(_mm256_and_si256(q, low4));
    hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4));
  } else {
    auto at = [&](int o) AVX2 { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k + o)); };
    lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(at(0)));
    hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(at(8)));
  }
}

template <int BITS>
const uint8_t* row_of(const QmmProblem& p, int n) {
  return reinterpret_cast<const uint8_t*>(p.w) + static_cast<size_t>(n) * p.K * BITS / 8;
}

// Activation rows [m0, m0 + MT) x output rows [n_begin, n_end), NT output rows at a time
// (n_end - n_begin a multiple of NT): per 16 weights of an output row, dequantize them
// once, then FMA them into each activation row's accumulator. MT * NT accumulators, 8
// where the rows allow: independent FMA chains that cover the FMA latency.
template <int BITS, int MT, int NT, ScaleType ST>
AVX2 void tile(const QmmProblem& p, const Prepared& xp, int m0, int n_begin, int n_end) {
  const int gs = p.group_size;
  const int groups = p.K / gs;
  const size_t K = static_cast<size_t>(p.K);
  const float* x = xp.x.data() + static_cast<size_t>(m0) * K;
  const __m256i low4 = _mm256_set1_epi32(0xf);
  // Only the first pass over these output rows reads them from memory (later activation
  // rows find them in cache).
  const long ahead = m0 == 0 ? g_prefetch_distance.load(std::memory_order_relaxed) : 0;
  const size_t group_bytes = static_cast<size_t>(gs) * BITS / 8 * NT;
  for (int n0 = n_begin; n0 < n_end; n0 += NT) {
    const uint8_t* w[NT];
    for (int j = 0; j < NT; ++j) {
      w[j] = row_of<BITS>(p, n0 + j);
    }
    __m256 acc[MT * NT];
    for (int a = 0; a < MT * NT; ++a) {
      acc[a] = _mm256_setzero_ps();
    }
    GroupScales<NT, ST> scales;
    for (int g = 0; g < groups; ++g) {
      scales.at_group(p, n0, groups, g);
      prefetch_ahead(w[0], g * group_bytes, (g + 1) * group_bytes, ahead);
      for (int k = g * gs; k < (g + 1) * gs; k += 16) {
        for (int j = 0; j < NT; ++j) {
          __m256 lo, hi;
          unpack<BITS>(w[j], k, low4, lo, hi);
          lo = _mm256_fmadd_ps(lo, scales.s(j, g), scales.b(j, g));
          hi = _mm256_fmadd_ps(hi, scales.s(j, g), scales.b(j, g));
          for (int i = 0; i < MT; ++i) {
            acc[i * NT + j] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + i * K + k), acc[i * NT + j]);
            acc[i * NT + j] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + i * K + k + 8), acc[i * NT + j]);
          }
        }
      }
    }
    for (int i = 0; i < MT; ++i) {
      for (int j = 0; j < NT; ++j) {
        p.y[static_cast<size_t>(m0 + i) * p.N + n0 + j] = hsum(acc[i * NT + j]);
      }
    }
  }
}

// Output rows [n_begin, n_end) for activation rows [m, m + MT): NT at a time, the last
// 1 to NT - 1 one at a time.
template <int BITS, int MT, ScaleType ST>
void rows_of_tile(const QmmProblem& p, const Prepared& xp, int m, int n_begin, int n_end) {
  constexpr int NT = MT >= 4 ? 2 : 4;
  const int tiles_end = n_begin + (n_end - n_begin) / NT * NT;
  tile<BITS, MT, NT, ST>(p, xp, m, n_begin, tiles_end);
  if constexpr (NT > 1) {
    tile<BITS, MT, 1, ST>(p, xp, m, tiles_end, n_end);
  }
}

// Output rows [n0, n0 + count) dequantized into out ([count][K], x's order): each weight
// the very fma(q, s, b) the tiles compute in registers.
template <int BITS, ScaleType ST>
AVX2 void dequantize_rows(const QmmProblem& p, int n0, int count, float* out) {
  const int gs = p.group_size;
  const int groups = p.K / gs;
  const __m256i low4 = _mm256_set1_epi32(0xf);
  for (int j = 0; j < count; ++j) {
    const uint8_t* w = row_of<BITS>(p, n0 + j);
    float* row = out + static_cast<size_t>(j) * p.K;
    GroupScales<1, ST> scales;
    for (int g = 0; g < groups; ++g) {
      scales.at_group(p, n0 + j, groups, g);
      const __m256 s = scales.s(0, g), b = scales.b(0, g);
      for (int k = g * gs; k < (g + 1) * gs; k += 16) {
        __m256 lo, hi;
        unpack<BITS>(w, k, low4, lo, hi);
        _mm256_store_ps(row + k, _mm256_fmadd_ps(lo, s, b));
        _mm256_store_ps(row + k + 8, _mm256_fmadd_ps(hi, s, b));
      }
    }
  }
}

// Activation rows [m0, m0 + MT) x the NT dequantized output rows at wd (n0 on): one
// accumulator per pair, the FMAs over k in the tiles' order, so the same bits as tile().
// Each 8 weights and activations are loaded once for the whole MT x NT block: 12 FMAs
// to 7 loads, where tile() loads an activation vector for every FMA.
template <int MT, int NT>
AVX2 void block_product(const QmmProblem& p, const Prepared& xp, const float* wd, int m0,
                        int n0) {
  const size_t K = static_cast<size_t>(p.K);
  const float* x = xp.x.data() + static_cast<size_t>(m0) * K;
  __m256 acc[MT][NT];
  for (int i = 0; i < MT; ++i) {
    for (int j = 0; j < NT; ++j) {
      acc[i][j] = _mm256_setzero_ps();
    }
  }
  for (size_t k = 0; k < K; k += 8) {
    __m256 w[NT];
    for (int j = 0; j < NT; ++j) {
      w[j] = _mm256_load_ps(wd + j * K + k);
    }
    for (int i = 0; i < MT; ++i) {
      const __m256 xi = _mm256_loadu_ps(x + i * K + k);
      for (int j = 0; j < NT; ++j) {
        acc[i][j] = _mm256_fmadd_ps(w[j], xi, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MT; ++i) {
    for (int j = 0; j < NT; ++j) {
      p.y[static_cast<size_t>(m0 + i) * p.N + n0 + j] = hsum(acc[i][j]);
    }
  }
}

// Every activation row x NT dequantized output rows, 4 rows at a time, then the rest.
template <int NT>
void block_rows(const QmmProblem& p, const Prepared& xp, const float* wd, int n0) {
  int m = 0;
  for (; m + 4 <= p.M; m += 4) {
    block_product<4, NT>(p, xp, wd, m, n0);
  }
  switch (p.M - m) {
    case 3: block_product<3, NT>(p, xp, wd, m, n0); break;
    case 2: block_product<2, NT>(p, xp, wd, m, n0); break;
    case 1: block_product<1, NT>(p, xp, wd, m, n0); break;
    default: break;
  }
}

// Many activation rows: kBlockOutputs output rows at a time are dequantized once into a
// buffer in L1, then multiplied as floats into every row (block_rows). The tiles above
// dequantize each weight again for every few rows and load an activation vector for
// every FMA, which bounds them at ~half the FMA peak.
template <int BITS, ScaleType ST>
void rows_dequantized(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  thread_local std::vector<float, CacheLineAllocator<float>> buffer;
  buffer.resize(static_cast<size_t>(kBlockOutputs) * p.K);
  for (int n0 = n_begin; n0 < n_end; n0 += kBlockOutputs) {
    const int count = std::min(kBlockOutputs, n_end - n0);
    dequantize_rows<BITS, ST>(p, n0, count, buffer.data());
    static_assert(kBlockOutputs == 3, "block_rows below takes 1-3 output rows");
    switch (count) {
      case 3: block_rows<3>(p, xp, buffer.data(), n0); break;
      case 2: block_rows<2>(p, xp, buffer.data(), n0); break;
      default: block_rows<1>(p, xp, buffer.data(), n0); break;
    }
  }
}

template <int BITS, ScaleType ST>
void rows_typed(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  if (p.M >= kDequantizedRows) {
    rows_dequantized<BITS, ST>(p, xp, n_begin, n_end);
    return;
  }
  // Output rows in blocks whose weights stay in L2 while every activation row's tile
  // passes over them.
  const size_t row_bytes = static_cast<size_t>(p.K) * BITS / 8;
  const int block = std::max<int>(4, static_cast<int>(kWeightBlockBytes / row_bytes) & ~3);
  for (int nb = n_begin; nb < n_end; nb += block) {
    const int ne = std::min(n_end, nb + block);
    static_assert(kDequantizedRows == 6, "the tiles below take 1-5 rows");
    switch (p.M) {
      case 5: rows_of_tile<BITS, 5, ST>(p, xp, 0, nb, ne); break;
      case 4: rows_of_tile<BITS, 4, ST>(p, xp, 0, nb, ne); break;
      case 3: rows_of_tile<BITS, 3, ST>(p, xp, 0, nb, ne); break;
      case 2: rows_of_tile<BITS, 2, ST>(p, xp, 0, nb, ne); break;
      default: rows_of_tile<BITS, 1, ST>(p, xp, 0, nb, ne); break;
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

void rows_avx2(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  if (p.bits == 4) {
    rows_bits<4>(p, xp, n_begin, n_end);
  } else {
    rows_bits<8>(p, xp, n_begin, n_end);
  }
}

} // namespace vllm_mlx_kernels

#endif // __x86_64__
