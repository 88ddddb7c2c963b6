// Checks qmm() and sdpa_prefill() against a plain double-precision reference on random
// problems, for every instruction set the running CPU has (natively, or under qemu-aarch64
// for the NEON tiles and the portable attention loops as the arm64 compiler vectorizes
// them); tests/unit/test_qmm_native.py builds and runs it. Prints one line per set.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn_kernel.h"
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

// sdpa_prefill on a random problem (causal, or a random bool mask with some rows all
// false): the largest absolute error against softmax in double precision.
double check_prefill(std::mt19937& rng, int B, int Hq, int Hkv, int M, int L, int D, int Dv,
                     bool causal, bool masked) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(B) * Hq * M * D), k(static_cast<size_t>(B) * Hkv * L * D),
      v(static_cast<size_t>(B) * Hkv * L * Dv), out(static_cast<size_t>(B) * Hq * M * Dv);
  for (auto* a : {&q, &k, &v}) {
    for (auto& x : *a) x = unit(rng) * 2.0f;
  }
  std::unique_ptr<bool[]> mask(new bool[static_cast<size_t>(B) * M * L]);
  for (size_t i = 0; i < static_cast<size_t>(B) * M * L; ++i) {
    size_t row = i / L;
    mask[i] = row % 7 != 3 && unit(rng) > -0.6f; // every 7th row sees nothing
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  PrefillProblem p{};
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out.data();
  p.q_strides[0] = static_cast<int64_t>(Hq) * M * D, p.q_strides[1] = static_cast<int64_t>(M) * D;
  p.q_strides[2] = D;
  p.k_strides[0] = static_cast<int64_t>(Hkv) * L * D, p.k_strides[1] = static_cast<int64_t>(L) * D;
  p.k_strides[2] = D;
  p.v_strides[0] = static_cast<int64_t>(Hkv) * L * Dv, p.v_strides[1] = static_cast<int64_t>(L) * Dv;
  p.v_strides[2] = Dv;
  p.mask = masked ? mask.get() : nullptr, p.mask_batches = B, p.causal = causal;
  p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.M = M, p.L = L, p.D = D, p.Dv = Dv, p.scale = scale;
  sdpa_prefill(p);
  double worst = 0.0;
  std::vector<double> w(L);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < Hq; ++h) {
      const float* kh = k.data() + (static_cast<size_t>(b) * Hkv + h / (Hq / Hkv)) * L * D;
      const float* vh = v.data() + (static_cast<size_t>(b) * Hkv + h / (Hq / Hkv)) * L * Dv;
      for (int m = 0; m < M; ++m) {
        const float* qm = q.data() + ((static_cast<size_t>(b) * Hq + h) * M + m) * D;
        double top = -1e300;
        int seen = 0;
        for (int t = 0; t < L; ++t) {
          bool sees = (!causal || t <= L - M + m) &&
              (!masked || mask[(static_cast<size_t>(b) * M + m) * L + t]);
          double s = 0.0;
          for (int d = 0; d < D; ++d) s += static_cast<double>(qm[d] * scale) * kh[t * D + d];
          w[t] = sees ? s : -1e300;
          seen += sees;
          top = sees && s > top ? s : top;
        }
        double sum = 0.0;
        for (int t = 0; t < L; ++t) {
          w[t] = seen == 0 ? 1.0 : (w[t] == -1e300 ? 0.0 : std::exp(w[t] - top));
          sum += w[t];
        }
        for (int c = 0; c < Dv; ++c) {
          double ref = 0.0;
          for (int t = 0; t < L; ++t) ref += w[t] / sum * vh[t * Dv + c];
          double got = out[((static_cast<size_t>(b) * Hq + h) * M + m) * Dv + c];
          worst = std::fabs(ref - got) > worst ? std::fabs(ref - got) : worst;
        }
      }
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
    // Prefill attention: a partial query block, offsets 0 and > 0, GQA 3 and 1, odd dims.
    const int shapes[][7] = {{1, 6, 2, 70, 70, 64, 64}, {2, 3, 3, 9, 130, 40, 24},
                             {1, 2, 1, 64, 200, 72, 72}, {1, 4, 2, 9, 5, 16, 16}};
    for (const auto& sh : shapes) {
      for (int mode = 0; mode < 3; ++mode) {
        double err = check_prefill(rng, sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], sh[6],
                                   mode != 1, mode != 0);
        if (err > 1e-5) {
          std::printf("FAIL isa=%s sdpa_prefill M=%d L=%d D=%d mode=%d threads=%d err=%g\n",
                      isa(), sh[3], sh[4], sh[5], mode, threads, err);
          return -1.0;
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
