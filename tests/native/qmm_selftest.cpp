// Checks qmm() against a plain double-precision reference on random problems, for every
// instruction set the running CPU has (natively, or under qemu-aarch64 for the NEON
// tiles); tests/unit/test_qmm_native.py builds and runs it. Prints one line per set.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "qmm_kernel.h"

using namespace vllm_mlx_kernels;

namespace {

uint16_t to_half(float f) {  // round-to-nearest is not needed: values are exact in f16
  uint32_t b;
  std::memcpy(&b, &f, 4);
  uint32_t sign = (b >> 16) & 0x8000u;
  int exp = static_cast<int>((b >> 23) & 0xff) - 127 + 15;
  uint32_t mant = (b >> 13) & 0x3ffu;
  if (exp <= 0) return static_cast<uint16_t>(sign);
  return static_cast<uint16_t>(sign | (exp << 10) | mant);
}

float from_half(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  uint32_t b = exp == 0 ? sign : sign | (exp + 127 - 15) << 23 | mant << 13;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

double check(std::mt19937& rng, int M, int N, int K, int bits, int gs, ScaleType st) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<uint32_t> word;
  int groups = K / gs, per_word = 32 / bits;
  std::vector<float> x(static_cast<size_t>(M) * K), y(static_cast<size_t>(M) * N);
  std::vector<uint32_t> w(static_cast<size_t>(N) * K / per_word);
  std::vector<float> s(static_cast<size_t>(N) * groups), b(s.size());
  for (auto& v : x) v = unit(rng);
  for (auto& v : w) v = word(rng);
  for (auto& v : s) v = unit(rng) * 0.1f;
  for (auto& v : b) v = unit(rng) * 0.1f;
  std::vector<uint16_t> s16(s.size()), b16(b.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (st == ScaleType::f16) {
      s16[i] = to_half(s[i]), b16[i] = to_half(b[i]);
      s[i] = from_half(s16[i]), b[i] = from_half(b16[i]);
    } else if (st == ScaleType::bf16) {
      uint32_t sb, bb;
      std::memcpy(&sb, &s[i], 4), std::memcpy(&bb, &b[i], 4);
      s16[i] = static_cast<uint16_t>(sb >> 16), b16[i] = static_cast<uint16_t>(bb >> 16);
      sb = static_cast<uint32_t>(s16[i]) << 16, bb = static_cast<uint32_t>(b16[i]) << 16;
      std::memcpy(&s[i], &sb, 4), std::memcpy(&b[i], &bb, 4);
    }
  }
  bool wide = st == ScaleType::f32;
  QmmProblem p{x.data(), w.data(), wide ? static_cast<const void*>(s.data()) : s16.data(),
               wide ? static_cast<const void*>(b.data()) : b16.data(), y.data(), M, N, K,
               gs, bits, st};
  qmm(p);
  // Batch invariance: each row computed alone must give the same bits as in the batch.
  for (int m = 0; m < M; ++m) {
    std::vector<float> alone(N);
    QmmProblem one = p;
    one.x = x.data() + static_cast<size_t>(m) * K;
    one.y = alone.data();
    one.M = 1;
    qmm(one);
    if (std::memcmp(alone.data(), y.data() + static_cast<size_t>(m) * N, 4 * N) != 0) {
      return 1.0; // reported as a failure by the caller
    }
  }
  double worst = 0.0;
  uint32_t mask = (1u << bits) - 1;
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      double ref = 0.0, scale = 0.0;
      for (int k = 0; k < K; ++k) {
        uint32_t q = (w[static_cast<size_t>(n) * (K / per_word) + k / per_word] >>
                      ((k % per_word) * bits)) & mask;
        size_t g = static_cast<size_t>(n) * groups + k / gs;
        double wk = static_cast<double>(s[g]) * q + b[g];
        ref += wk * x[static_cast<size_t>(m) * K + k];
        scale += std::fabs(wk * x[static_cast<size_t>(m) * K + k]);
      }
      double err = std::fabs(ref - y[static_cast<size_t>(m) * N + n]) / (scale + 1e-12);
      worst = err > worst ? err : worst;
    }
  }
  return worst;
}

}  // namespace

// Every case for the current instruction set; the worst error, or -1 on a failure.
double run_cases(std::mt19937& rng) {
  const int Ms[] = {1, 2, 3, 5, 8, 9, 16};
  const int Ns[] = {1, 4, 7, 33};
  const ScaleType types[] = {ScaleType::f32, ScaleType::f16, ScaleType::bf16};
  double worst = 0.0;
  for (int threads : {1, 2}) {
    set_threads(threads);
    set_parallel_min(threads == 1 ? 1L << 22 : 0); // threads 2: split even small ones
    for (int bits : {4, 8}) {
      for (int gs : {32, 64, 128}) {
        for (int M : Ms) {
          for (int N : Ns) {
            for (ScaleType st : types) {
              double err = check(rng, M, N, gs * 3, bits, gs, st);
              worst = err > worst ? err : worst;
              if (err > 1e-5) {
                std::printf("FAIL isa=%s bits=%d gs=%d M=%d N=%d threads=%d err=%g\n", isa(),
                            bits, gs, M, N, threads, err);
                return -1.0;
              }
            }
          }
        }
      }
    }
  }
  return worst;
}

int main() {
  std::mt19937 rng(1234);
  for (const char* name : {"scalar", "avx2", "avx512", "neon"}) {
    try {
      set_isa(name);
    } catch (const std::invalid_argument&) {
      continue; // not this CPU's
    }
    double worst = run_cases(rng);
    if (worst < 0) {
      return 1;
    }
    std::printf("ok isa=%s worst_relative_error=%.3g\n", isa(), worst);
  }
  return 0;
}
