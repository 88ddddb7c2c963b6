#include "dequant.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "qmm_internal.h"
#include "thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace vllm_mlx_kernels {

namespace {

// float -> the nearest float16 (ties to even) -> float: one float16 operation as MLX's
// CPU backend does it (in float, rounded after each op).
inline float round_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = x & 0x80000000u;
  const uint32_t abs = x & 0x7fffffffu;
  uint16_t h;
  if (abs >= 0x7f800000u) { // inf or nan
    h = static_cast<uint16_t>((abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
  } else if (abs >= 0x47800000u) { // >= 65536: overflows to inf
    h = 0x7c00u;
  } else if (abs < 0x38800000u) { // below the smallest normal half: a subnormal or 0
    // Let the FPU round: adding 0.5 aligns the half subnormal grid (2^-24) at the
    // mantissa's last bit, and the FPU rounds to nearest even.
    float a;
    std::memcpy(&a, &abs, 4);
    float t = a + 0.5f;
    uint32_t tb;
    std::memcpy(&tb, &t, 4);
    h = static_cast<uint16_t>(tb - 0x3f000000u);
  } else {
    const uint32_t mant_odd = (abs >> 13) & 1u;
    const uint32_t rounded = abs + 0xfffu + mant_odd; // ties to even
    h = static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
  }
  return half_to_float(static_cast<uint16_t>(h | (sign >> 16)));
}

inline float round_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return f; // nan stays nan
  }
  x = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u; // ties to even
  float out;
  std::memcpy(&out, &x, 4);
  return out;
}

// One rounding to the scales' type: MLX computes s * q + b in that type (and only then
// converts to float32), so the prefill path keeps its numbers bit for bit.
template <ScaleType ST>
inline float in_type(float f) {
  if constexpr (ST == ScaleType::f16) {
    return round_to_half(f);
  } else if constexpr (ST == ScaleType::bf16) {
    return round_to_bf16(f);
  } else {
    return f;
  }
}

// s * q + b exactly as MLX's dequantize computes it (the build sets -ffp-contract=off).
template <ScaleType ST>
inline float value(float s, float q, float b) {
  return in_type<ST>(in_type<ST>(s * q) + b);
}

template <ScaleType ST>
float scale_at(const void* base, size_t i) {
  if constexpr (ST == ScaleType::f32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (ST == ScaleType::f16) {
    return half_to_float(static_cast<const uint16_t*>(base)[i]);
  } else {
    return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  }
}

// Rows [n_begin, n_end), portable. Rounding the 4-bit table's values in software is most
// of its time (AVX-512 has its own loop below).
template <int BITS, ScaleType ST>
void rows(const QmmProblem& p, float* out, int n_begin, int n_end) {
  constexpr int per_word = 32 / BITS;
  constexpr uint32_t mask = (1u << BITS) - 1;
  const int groups = p.K / p.group_size;
  const int words_per_group = p.group_size / per_word;
  const size_t words_per_row = static_cast<size_t>(p.K) / per_word;
  for (int n = n_begin; n < n_end; ++n) {
    const uint32_t* w = p.w + n * words_per_row;
    float* o = out + static_cast<size_t>(n) * p.K;
    for (int g = 0; g < groups; ++g) {
      const size_t at = static_cast<size_t>(n) * groups + g;
      const float s = scale_at<ST>(p.scales, at);
      const float b = scale_at<ST>(p.biases, at);
      float* group_out = o + g * p.group_size;
      const uint32_t* words = w + g * words_per_group;
      if constexpr (BITS == 4) {
        // 16 values a group can take, for 32-128 weights: compute each once.
        float table[16];
        for (int q = 0; q < 16; ++q) {
          table[q] = value<ST>(s, static_cast<float>(q), b);
        }
        for (int wi = 0; wi < words_per_group; ++wi) {
          const uint32_t word = words[wi];
          float* dst = group_out + wi * per_word;
          for (int i = 0; i < per_word; ++i) {
            dst[i] = table[(word >> (BITS * i)) & mask];
          }
        }
      } else {
        for (int wi = 0; wi < words_per_group; ++wi) {
          const uint32_t word = words[wi];
          float* dst = group_out + wi * per_word;
          for (int i = 0; i < per_word; ++i) {
            dst[i] = value<ST>(s, static_cast<float>((word >> (BITS * i)) & mask), b);
          }
        }
      }
    }
  }
}

#if defined(__x86_64__)
#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

// The 16 values a 4-bit group can take, as `value` computes them: vcvtps2ph rounds to
// nearest even like round_to_half, so the table holds the same floats.
template <ScaleType ST>
AVX512 inline __m512 group_table(float s, float b) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 v = _mm512_mul_ps(_mm512_set1_ps(s), q);
  if constexpr (ST == ScaleType::f16) {
    v = _mm512_cvtph_ps(_mm512_cvtps_ph(v, kNearest));
    v = _mm512_add_ps(v, _mm512_set1_ps(b));
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, kNearest));
  } else {
    return _mm512_add_ps(v, _mm512_set1_ps(b));
  }
}

// 4-bit rows with float16 or float32 scales: the group's table in one register, and 16
// weights (two words) looked up by one permute. The scalar loop spent ~3 ms on one
// 1536 x 576 layer here, most of it rounding the table's 32 values in software.
template <ScaleType ST>
AVX512 void rows4_avx512(const QmmProblem& p, float* out, int n_begin, int n_end) {
  const int groups = p.K / p.group_size;
  const size_t words_per_row = static_cast<size_t>(p.K) / 8;
  const __m512i shifts =
      _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
  const __m512i first_or_second = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i nibble = _mm512_set1_epi32(0xf);
  for (int n = n_begin; n < n_end; ++n) {
    const uint32_t* w = p.w + n * words_per_row;
    float* o = out + static_cast<size_t>(n) * p.K;
    for (int g = 0; g < groups; ++g) {
      const size_t at = static_cast<size_t>(n) * groups + g;
      const __m512 table = group_table<ST>(scale_at<ST>(p.scales, at), scale_at<ST>(p.biases, at));
      const uint32_t* words = w + g * (p.group_size / 8);
      float* dst = o + g * p.group_size;
      for (int i = 0; i < p.group_size; i += 16) {
        const __m128i two = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(words + i / 8));
        const __m512i lanes = _mm512_permutexvar_epi32(first_or_second, _mm512_castsi128_si512(two));
        const __m512i index = _mm512_and_si512(_mm512_srlv_epi32(lanes, shifts), nibble);
        _mm512_storeu_ps(dst + i, _mm512_permutexvar_ps(index, table));
      }
    }
  }
}

#define AVX2 __attribute__((target("avx2,fma,f16c")))

// The AVX2 form: the table in two registers (values 0-7 and 8-15); 8 weights (one word)
// are looked up in both and bit 3 of each index picks one.
template <ScaleType ST>
AVX2 inline __m256 table_half_avx2(float s, float b, __m256 q) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  __m256 v = _mm256_mul_ps(_mm256_set1_ps(s), q);
  if constexpr (ST == ScaleType::f16) {
    v = _mm256_cvtph_ps(_mm256_cvtps_ph(v, kNearest));
    v = _mm256_add_ps(v, _mm256_set1_ps(b));
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, kNearest));
  } else {
    return _mm256_add_ps(v, _mm256_set1_ps(b));
  }
}

template <ScaleType ST>
AVX2 void rows4_avx2(const QmmProblem& p, float* out, int n_begin, int n_end) {
  const int groups = p.K / p.group_size;
  const size_t words_per_row = static_cast<size_t>(p.K) / 8;
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i nibble = _mm256_set1_epi32(0xf);
  for (int n = n_begin; n < n_end; ++n) {
    const uint32_t* w = p.w + n * words_per_row;
    float* o = out + static_cast<size_t>(n) * p.K;
    for (int g = 0; g < groups; ++g) {
      const size_t at = static_cast<size_t>(n) * groups + g;
      const float s = scale_at<ST>(p.scales, at);
      const float b = scale_at<ST>(p.biases, at);
      const __m256 low = table_half_avx2<ST>(s, b, _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7));
      const __m256 high = table_half_avx2<ST>(s, b, _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15));
      const uint32_t* words = w + g * (p.group_size / 8);
      float* dst = o + g * p.group_size;
      for (int i = 0; i < p.group_size / 8; ++i) {
        const __m256i word = _mm256_set1_epi32(static_cast<int>(words[i]));
        const __m256i index = _mm256_and_si256(_mm256_srlv_epi32(word, shifts), nibble);
        const __m256 from_low = _mm256_permutevar8x32_ps(low, index);
        const __m256 from_high = _mm256_permutevar8x32_ps(high, index);
        const __m256 upper = _mm256_castsi256_ps(_mm256_slli_epi32(index, 28)); // bit 3 -> sign
        _mm256_storeu_ps(dst + 8 * i, _mm256_blendv_ps(from_low, from_high, upper));
      }
    }
  }
}

// The vector loops (set_isa chooses among them: tests compare each with the scalar one).
bool vector_dispatch(const QmmProblem& p, float* out, int n_begin, int n_end) {
  if (p.bits != 4 || p.scale_type == ScaleType::bf16) {
    return false;
  }
  const bool f16 = p.scale_type == ScaleType::f16;
  if (std::strcmp(isa(), "avx512") == 0) {
    f16 ? rows4_avx512<ScaleType::f16>(p, out, n_begin, n_end)
        : rows4_avx512<ScaleType::f32>(p, out, n_begin, n_end);
    return true;
  }
  if (std::strcmp(isa(), "avx2") == 0) {
    f16 ? rows4_avx2<ScaleType::f16>(p, out, n_begin, n_end)
        : rows4_avx2<ScaleType::f32>(p, out, n_begin, n_end);
    return true;
  }
  return false;
}
#endif

void dispatch(const QmmProblem& p, float* out, int n_begin, int n_end) {
#if defined(__x86_64__)
  if (vector_dispatch(p, out, n_begin, n_end)) {
    return;
  }
#endif
  auto typed = [&]<int B>() {
    switch (p.scale_type) {
      case ScaleType::f32: rows<B, ScaleType::f32>(p, out, n_begin, n_end); break;
      case ScaleType::f16: rows<B, ScaleType::f16>(p, out, n_begin, n_end); break;
      case ScaleType::bf16: rows<B, ScaleType::bf16>(p, out, n_begin, n_end); break;
    }
  };
  if (p.bits == 4) {
    typed.template operator()<4>();
  } else {
    typed.template operator()<8>();
  }
}

} // namespace

void dequantize_weights(const QmmProblem& p, float* out) {
  // Below ~64k weights a second thread's wake-up costs more than it saves.
  long work = static_cast<long>(p.N) * p.K;
  int n_threads = work < (1L << 16) ? 1 : std::min(threads(), std::max(1, p.N / 8));
  if (n_threads <= 1) {
    dispatch(p, out, 0, p.N);
    return;
  }
  int per = std::max(8, p.N / (4 * n_threads)); // ~4 chunks a thread: a late one costs one
  int chunks = (p.N + per - 1) / per;
  shared_pool().run(n_threads, chunks, [&](int c) {
    dispatch(p, out, c * per, std::min(p.N, (c + 1) * per));
  });
}

} // namespace vllm_mlx_kernels
