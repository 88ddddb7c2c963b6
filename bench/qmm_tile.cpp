// The quantized matmul's tiles alone, on one product, without MLX or Python (issue 29,
// docs/benchmarks.md "Round 23"); and the CPU's FMA peak to hold them against:
//
//   K=daemon/vllm_mlx/kernels
//   g++ -std=c++20 -O3 -ffp-contract=off -I$K bench/qmm_tile.cpp $K/qmm_kernel.cpp \
//     $K/qmm_avx512.cpp $K/qmm_avx2.cpp $K/qmm_neon.cpp $K/qmm_int8.cpp \
//     $K/qmm_int8_avx2.cpp $K/qmm_vnni.cpp $K/thread_pool.cpp $K/dequant.cpp \
//     -lpthread -o /tmp/qmm_tile
//   /tmp/qmm_tile 16 1536 576            # M N K [threads bits group_size], f16 scales
//   ISA=avx2 /tmp/qmm_tile 16 1536 576   # another instruction set (set_isa)
//   /tmp/qmm_tile peak                   # multiply-adds a second, one core, 512/256 bits
//
// Prints microseconds a product, multiply-adds a second, and a hash of the output's bits:
// builds of different sources (-I and the sources from another checkout) must print the
// same hash for the same arguments, or the arithmetic changed.
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "qmm_kernel.h"

using namespace vllm_mlx_kernels;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// 16 independent FMA chains: enough to keep two FMA units busy through their latency.
// Every chain reaches the printed sum, so none can be dropped.
__attribute__((target("avx512f"))) double peak512(long steps) {
  __m512 acc[16];
  const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
  for (int i = 0; i < 16; ++i) {
    acc[i] = _mm512_set1_ps(static_cast<float>(i));
  }
  auto start = std::chrono::steady_clock::now();
  for (long s = 0; s < steps; ++s) {
    for (int i = 0; i < 16; ++i) {
      acc[i] = _mm512_fmadd_ps(acc[i], m, c);
    }
  }
  const double took = seconds_since(start);
  float sum = 0;
  for (int i = 0; i < 16; ++i) {
    sum += _mm512_reduce_add_ps(acc[i]);
  }
  std::printf("(sum %g) ", sum);
  return static_cast<double>(steps) * 16 * 16 / took / 1e9;
}

__attribute__((target("avx2,fma"))) double peak256(long steps) {
  __m256 acc[12];
  const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
  for (int i = 0; i < 12; ++i) {
    acc[i] = _mm256_set1_ps(static_cast<float>(i));
  }
  auto start = std::chrono::steady_clock::now();
  for (long s = 0; s < steps; ++s) {
    for (int i = 0; i < 12; ++i) {
      acc[i] = _mm256_fmadd_ps(acc[i], m, c);
    }
  }
  const double took = seconds_since(start);
  float sum = 0;
  for (int i = 0; i < 12; ++i) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[i]);
    for (float v : lanes) {
      sum += v;
    }
  }
  std::printf("(sum %g) ", sum);
  return static_cast<double>(steps) * 12 * 8 / took / 1e9;
}

int product(int argc, char** argv) {
  const int M = std::atoi(argv[1]), N = std::atoi(argv[2]), K = std::atoi(argv[3]);
  const int threads = argc > 4 ? std::atoi(argv[4]) : 1;
  const int bits = argc > 5 ? std::atoi(argv[5]) : 4;
  const int group_size = argc > 6 ? std::atoi(argv[6]) : 32;
  set_threads(threads);
  if (const char* isa = std::getenv("ISA")) {
    set_isa(isa);
  }
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M) * K), y(static_cast<size_t>(M) * N);
  for (float& v : x) {
    v = unit(rng);
  }
  std::vector<uint32_t> w(static_cast<size_t>(N) * K * bits / 32);
  for (uint32_t& v : w) {
    v = rng();
  }
  // float16 scales around 2^-7 and biases around -2^-7: weights of a trained model's size
  std::vector<uint16_t> scales(static_cast<size_t>(N) * K / group_size);
  std::vector<uint16_t> biases(scales.size());
  for (size_t i = 0; i < scales.size(); ++i) {
    scales[i] = static_cast<uint16_t>(0x2000 + (rng() & 0xff));
    biases[i] = static_cast<uint16_t>(0xa000 + (rng() & 0xff));
  }
  QmmProblem p{x.data(), w.data(), scales.data(), biases.data(), y.data(), M, N, K,
               group_size, bits, ScaleType::f16};
  for (int i = 0; i < 50; ++i) {
    qmm(p);
  }
  const int reps = 2000;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    qmm(p);
  }
  const double each = seconds_since(start) / reps;
  uint64_t hash = 1469598103934665603ull; // FNV-1a over the output's bits
  for (float v : y) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    hash = (hash ^ u) * 1099511628211ull;
  }
  std::printf("M=%d N=%d K=%d isa=%s: %.1f us  %.1f GFMA/s  hash %016llx\n", M, N, K, isa(),
              each * 1e6, static_cast<double>(M) * N * K / each / 1e9,
              static_cast<unsigned long long>(hash));
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "peak") {
    const long steps = 100000000;
    std::printf("one core: 512-bit FMAs %.1f GFMA/s, 256-bit FMAs %.1f GFMA/s\n",
                peak512(steps), peak256(steps));
    return 0;
  }
  if (argc < 4) {
    std::fprintf(stderr, "usage: qmm_tile M N K [threads bits group_size] | qmm_tile peak\n");
    return 2;
  }
  return product(argc, argv);
}
