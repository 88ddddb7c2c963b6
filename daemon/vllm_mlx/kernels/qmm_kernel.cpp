#include "qmm_kernel.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define VLLM_MLX_X86 1
#endif

namespace vllm_mlx_kernels {

namespace {

// Below this many weights a matmul runs on one thread: waking workers costs more.
constexpr long kParallelMinWeights = 1L << 17;

int g_threads = 0; // 0: not set, use the default

int default_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(std::min(n, 16u));
}

ThreadPool& pool() {
  // Never destroyed: joining workers during static destruction at exit can deadlock.
  static ThreadPool* p = new ThreadPool();
  return *p;
}

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else { // subnormal: renormalise
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Row n's scales (or biases) as float32 for the portable path: a pointer into the input
// when it already is.
const float* row_as_float(const QmmProblem& p, const void* base, int n, float* buf) {
  int groups = p.K / p.group_size;
  size_t offset = static_cast<size_t>(n) * groups;
  if (p.scale_type == ScaleType::f32) {
    return static_cast<const float*>(base) + offset;
  }
  const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
  for (int g = 0; g < groups; ++g) {
    buf[g] = p.scale_type == ScaleType::f16 ? half_to_float(src[g]) : bf16_to_float(src[g]);
  }
  return buf;
}

// The activations the kernels read: x reordered to match how weights unpack (4-bit
// kernels unpack a chunk of 16 weights as the 8 low nibbles, then the 8 high ones),
// and x's sum over each group (the bias term is b[n, g] * sum of x over group g).
struct Prepared {
  std::vector<float> x;
  std::vector<float> sums;
};

void prepare(const QmmProblem& p, bool interleave, Prepared& out) {
  int groups = p.K / p.group_size;
  out.x.resize(static_cast<size_t>(p.M) * p.K);
  out.sums.resize(static_cast<size_t>(p.M) * groups);
  for (int m = 0; m < p.M; ++m) {
    const float* src = p.x + static_cast<size_t>(m) * p.K;
    float* dst = out.x.data() + static_cast<size_t>(m) * p.K;
    if (interleave) {
      for (int k0 = 0; k0 < p.K; k0 += 16) {
        for (int t = 0; t < 8; ++t) {
          dst[k0 + t] = src[k0 + 2 * t];
          dst[k0 + 8 + t] = src[k0 + 2 * t + 1];
        }
      }
    } else {
      std::memcpy(dst, src, sizeof(float) * p.K);
    }
    for (int g = 0; g < groups; ++g) {
      float s = 0.0f;
      for (int k = g * p.group_size; k < (g + 1) * p.group_size; ++k) {
        s += src[k];
      }
      out.sums[static_cast<size_t>(m) * groups + g] = s;
    }
  }
}

// Portable path (arm64 Linux, x86 without AVX2): unpack a group, then plain loops the
// compiler can vectorise. Reads x in its natural order.
void rows_scalar(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  int groups = p.K / p.group_size;
  int per_word = 32 / p.bits;
  uint32_t mask = (1u << p.bits) - 1;
  std::vector<float> sbuf(groups), bbuf(groups);
  float wq[128];
  std::vector<float> acc(p.M);
  for (int n = n_begin; n < n_end; ++n) {
    const float* s = row_as_float(p, p.scales, n, sbuf.data());
    const float* b = row_as_float(p, p.biases, n, bbuf.data());
    const uint32_t* w = p.w + static_cast<size_t>(n) * (p.K / per_word);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int g = 0; g < groups; ++g) {
      int k0 = g * p.group_size;
      for (int k = 0; k < p.group_size; ++k) {
        int idx = k0 + k;
        wq[k] = static_cast<float>((w[idx / per_word] >> ((idx % per_word) * p.bits)) & mask);
      }
      for (int m = 0; m < p.M; ++m) {
        const float* x = p.x + static_cast<size_t>(m) * p.K + k0;
        float dot = 0.0f;
        for (int k = 0; k < p.group_size; ++k) {
          dot += wq[k] * x[k];
        }
        acc[m] += s[g] * dot + b[g] * xp.sums[static_cast<size_t>(m) * groups + g];
      }
    }
    for (int m = 0; m < p.M; ++m) {
      p.y[static_cast<size_t>(m) * p.N + n] = acc[m];
    }
  }
}

#ifdef VLLM_MLX_X86

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
  for (int g = 0; g < groups; ++g) {
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
      __m256 scale = _mm256_set1_ps(load_scale<ST>(p.scales, at));
      float b = load_scale<ST>(p.biases, at);
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

// Output rows [n_begin, n_end): one activation row takes 4 output rows at a time;
// several take one output row and up to 4 activation rows.
template <int BITS, ScaleType ST>
void rows_avx2(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  if (p.M == 1) {
    int n = n_begin;
    for (; n + 4 <= n_end; n += 4) {
      tile_avx2<BITS, 1, 4, ST>(p, xp, 0, n);
    }
    for (; n < n_end; ++n) {
      tile_avx2<BITS, 1, 1, ST>(p, xp, 0, n);
    }
    return;
  }
  for (int n = n_begin; n < n_end; ++n) {
    int m = 0;
    for (; m + 4 <= p.M; m += 4) {
      tile_avx2<BITS, 4, 1, ST>(p, xp, m, n);
    }
    switch (p.M - m) {
      case 3: tile_avx2<BITS, 3, 1, ST>(p, xp, m, n); break;
      case 2: tile_avx2<BITS, 2, 1, ST>(p, xp, m, n); break;
      case 1: tile_avx2<BITS, 1, 1, ST>(p, xp, m, n); break;
      default: break;
    }
  }
}

template <int BITS>
void rows_avx2_typed(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  switch (p.scale_type) {
    case ScaleType::f32: rows_avx2<BITS, ScaleType::f32>(p, xp, n_begin, n_end); break;
    case ScaleType::f16: rows_avx2<BITS, ScaleType::f16>(p, xp, n_begin, n_end); break;
    case ScaleType::bf16: rows_avx2<BITS, ScaleType::bf16>(p, xp, n_begin, n_end); break;
  }
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c");
  return yes;
}

#endif // VLLM_MLX_X86

void rows(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
#ifdef VLLM_MLX_X86
  if (has_avx2()) {
    if (p.bits == 4) {
      rows_avx2_typed<4>(p, xp, n_begin, n_end);
    } else {
      rows_avx2_typed<8>(p, xp, n_begin, n_end);
    }
    return;
  }
#endif
  rows_scalar(p, xp, n_begin, n_end);
}

} // namespace

bool supported(int bits, int group_size) {
  return (bits == 4 || bits == 8) &&
      (group_size == 32 || group_size == 64 || group_size == 128);
}

void set_threads(int n) {
  g_threads = std::max(1, n);
}

int threads() {
  return g_threads > 0 ? g_threads : default_threads();
}

const char* isa() {
#ifdef VLLM_MLX_X86
  if (has_avx2()) {
    return "avx2";
  }
#endif
  return "scalar";
}

void qmm(const QmmProblem& p) {
  // thread_local: the buffers outlive the call. Workers get it through a pointer, since
  // naming a thread_local inside the lambda would name the worker's own (empty) copy.
  thread_local Prepared prepared;
  const Prepared& xp = prepared;
  bool interleave = p.bits == 4 && std::strcmp(isa(), "scalar") != 0;
  prepare(p, interleave, prepared);
  long weights = static_cast<long>(p.N) * p.K;
  int n_threads = weights < kParallelMinWeights ? 1 : std::min(threads(), p.N / 4);
  if (n_threads <= 1) {
    rows(p, xp, 0, p.N);
    return;
  }
  // Split output rows in multiples of 4 so every thread keeps whole 4-row tiles.
  int per = ((p.N + n_threads - 1) / n_threads + 3) / 4 * 4;
  pool().run(n_threads, [&](int t) {
    int begin = std::min(p.N, t * per);
    int end = std::min(p.N, begin + per);
    if (begin < end) {
      rows(p, xp, begin, end);
    }
  });
}

} // namespace vllm_mlx_kernels
