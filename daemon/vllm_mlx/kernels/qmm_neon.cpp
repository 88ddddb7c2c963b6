// The NEON tiles for arm64 Linux (every arm64 CPU has NEON and FMA, so no run-time
// check). 4-bit weights: x is interleaved in blocks of 16, as for AVX2 (qmm_internal.h).
// Tested natively nowhere here: tests/unit/test_qmm_native.py cross-compiles this file
// with qmm_selftest.cpp and runs it under qemu-aarch64.
#include "qmm_internal.h"

#if defined(__aarch64__)
#include <arm_neon.h>

namespace vllm_mlx_kernels {

namespace {

// One scale or bias as float32 (arm64 has half-precision floats natively).
template <ScaleType ST>
inline float load_scale_neon(const void* base, size_t i) {
  if constexpr (ST == ScaleType::f32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (ST == ScaleType::f16) {
    return static_cast<float>(static_cast<const __fp16*>(base)[i]);
  } else {
    return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  }
}

// 8 unsigned bytes as two float32x4 (bytes 0-3, 4-7).
inline void widen8(uint8x8_t b, float32x4_t& first, float32x4_t& second) {
  uint16x8_t h = vmovl_u8(b);
  first = vcvtq_f32_u32(vmovl_u16(vget_low_u16(h)));
  second = vcvtq_f32_u32(vmovl_u16(vget_high_u16(h)));
}

// Round 11's AVX2 tile shape on NEON: per chunk of 16 weights, unpack once into four
// float32x4 (for 4 bits: the 8 low nibbles, then the 8 high ones, matching the
// interleaved activations), FMA into every activation row.
template <int BITS, int MT, int NT, ScaleType ST>
void tile_neon(const QmmProblem& p, const Prepared& xp, int m0, int n0) {
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
  float32x4_t tot[MT][NT];
  float bias[MT][NT];
  for (int i = 0; i < MT; ++i) {
    for (int j = 0; j < NT; ++j) {
      tot[i][j] = vdupq_n_f32(0.0f);
      bias[i][j] = 0.0f;
    }
  }
  const uint8x8_t low4 = vdup_n_u8(0xf);
  for (int g = 0; g < groups; ++g) {
    float32x4_t acc0[MT][NT], acc1[MT][NT];
    for (int i = 0; i < MT; ++i) {
      for (int j = 0; j < NT; ++j) {
        acc0[i][j] = vdupq_n_f32(0.0f);
        acc1[i][j] = vdupq_n_f32(0.0f);
      }
    }
    for (int k = g * gs; k < (g + 1) * gs; k += 16) {
      for (int j = 0; j < NT; ++j) {
        float32x4_t q0, q1, q2, q3;
        if constexpr (BITS == 4) {
          uint8x8_t b = vld1_u8(w[j] + k / 2);
          widen8(vand_u8(b, low4), q0, q1);
          widen8(vshr_n_u8(b, 4), q2, q3);
        } else {
          widen8(vld1_u8(w[j] + k), q0, q1);
          widen8(vld1_u8(w[j] + k + 8), q2, q3);
        }
        for (int i = 0; i < MT; ++i) {
          const float* xi = x[i] + k;
          acc0[i][j] = vfmaq_f32(acc0[i][j], q0, vld1q_f32(xi));
          acc1[i][j] = vfmaq_f32(acc1[i][j], q1, vld1q_f32(xi + 4));
          acc0[i][j] = vfmaq_f32(acc0[i][j], q2, vld1q_f32(xi + 8));
          acc1[i][j] = vfmaq_f32(acc1[i][j], q3, vld1q_f32(xi + 12));
        }
      }
    }
    for (int j = 0; j < NT; ++j) {
      size_t at = static_cast<size_t>(n0 + j) * groups + g;
      float scale = load_scale_neon<ST>(p.scales, at);
      float b = load_scale_neon<ST>(p.biases, at);
      for (int i = 0; i < MT; ++i) {
        tot[i][j] = vfmaq_n_f32(tot[i][j], vaddq_f32(acc0[i][j], acc1[i][j]), scale);
        bias[i][j] += b * xs[i][g];
      }
    }
  }
  for (int i = 0; i < MT; ++i) {
    for (int j = 0; j < NT; ++j) {
      p.y[static_cast<size_t>(m0 + i) * p.N + n0 + j] = vaddvq_f32(tot[i][j]) + bias[i][j];
    }
  }
}

struct NeonTiles {
  template <int BITS, int MT, int NT, ScaleType ST>
  static void run(const QmmProblem& p, const Prepared& xp, int m0, int n0) {
    tile_neon<BITS, MT, NT, ST>(p, xp, m0, n0);
  }
};

} // namespace

void rows_neon(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  rows_with_tiles<NeonTiles>(p, xp, n_begin, n_end);
}

} // namespace vllm_mlx_kernels

#endif // __aarch64__
