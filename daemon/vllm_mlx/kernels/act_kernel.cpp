// SwiGLU with MLX's arithmetic (mlx/backend/cpu/simd/math.h `exp`, unary_ops.h `Sigmoid`),
// vectorized. Step by step, as MLX computes it in float32:
//   x = a * 1.442695f;  i = floor(x + 0.5) (in double: exact);  f = x - i
//   p = 1.5353e-4f, then six fma(p, f, c);  e = 2^i * p  (2^i built from the exponent bits)
//   NaN -> a, a > 88 -> inf, a < -88 -> 0
//   sigmoid(g) = g < 0 ? y : 1 - y,  y = 1 / (1 + exp(|g|));  out = (g * sigmoid(g)) * u
// The vector paths get floor(x + 0.5) exactly from round-to-nearest-even plus one for an
// exact tie (x - round(x) is exact in float), and use hardware FMA, which rounds once as
// fmaf does. Every element takes the same operations wherever it sits (tails are masked
// or copied through a full vector), so the result never depends on the batch's shape.
#include "act_kernel.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "qmm_kernel.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace vllm_mlx_kernels {

namespace {

constexpr float kLog2e = 1.442695f;
constexpr float kPoly[] = {1.339887440266574e-3f, 9.618437357674640e-3f,
                           5.550332471162809e-2f, 2.402264791363012e-1f,
                           6.931472028550421e-1f, 1.000000000000000f};
constexpr float kPoly0 = 1.535336188319500e-4f;

float exp_scalar(float a) {
  float x = a * kLog2e;
  float ipart = static_cast<float>(std::floor(static_cast<double>(x) + 0.5));
  float fpart = x - ipart;
  float p = kPoly0;
  for (float c : kPoly) {
    p = std::fma(p, fpart, c);
  }
  if (std::isnan(a)) {
    return a;
  }
  if (a > 88.0f) {
    return std::numeric_limits<float>::infinity();
  }
  if (a < -88.0f) {
    return 0.0f;
  }
  // |a| <= 88 keeps ipart in [-127, 127]: the exponent bits are valid.
  uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(ipart) + 127) << 23;
  float two;
  std::memcpy(&two, &bits, 4);
  return two * p;
}

float swiglu_scalar(float g, float u) {
  float y = 1.0f / (1.0f + exp_scalar(std::fabs(g)));
  float s = g < 0.0f ? y : 1.0f - y;
  return (g * s) * u;
}

void swiglu_portable(const float* g, const float* u, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = swiglu_scalar(g[i], u[i]);
  }
}

#if defined(__x86_64__)

#define AVX512 __attribute__((target("avx512f,avx2,fma")))
#define AVX2 __attribute__((target("avx2,fma")))

AVX512 inline __m512 exp_avx512(__m512 a) {
  __m512 x = _mm512_mul_ps(a, _mm512_set1_ps(kLog2e));
  __m512 r = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __mmask16 tie = _mm512_cmp_ps_mask(_mm512_sub_ps(x, r), _mm512_set1_ps(0.5f), _CMP_EQ_OQ);
  __m512 ipart = _mm512_mask_add_ps(r, tie, r, _mm512_set1_ps(1.0f));
  __m512 fpart = _mm512_sub_ps(x, ipart);
  __m512 p = _mm512_set1_ps(kPoly0);
  for (float c : kPoly) {
    p = _mm512_fmadd_ps(p, fpart, _mm512_set1_ps(c));
  }
  __m512i e = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvttps_epi32(ipart), _mm512_set1_epi32(127)), 23);
  __m512 result = _mm512_mul_ps(_mm512_castsi512_ps(e), p);
  result = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), result, a);
  result = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(88.0f), _CMP_GT_OQ),
                                result, _mm512_set1_ps(std::numeric_limits<float>::infinity()));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(-88.0f), _CMP_LT_OQ),
                              result, _mm512_setzero_ps());
}

AVX512 inline __m512 swiglu_avx512(__m512 g, __m512 u) {
  __m512 one = _mm512_set1_ps(1.0f);
  __m512 absg = _mm512_abs_ps(g);
  __m512 y = _mm512_div_ps(one, _mm512_add_ps(one, exp_avx512(absg)));
  __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
  __m512 s = _mm512_mask_blend_ps(negative, _mm512_sub_ps(one, y), y);
  return _mm512_mul_ps(_mm512_mul_ps(g, s), u);
}

AVX512 void swiglu_avx512_all(const float* g, const float* u, float* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, swiglu_avx512(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  }
  if (i < n) {
    __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 r = swiglu_avx512(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i));
    _mm512_mask_storeu_ps(out + i, m, r);
  }
}

AVX512 void exp_avx512_all(float* x, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(x + i, exp_avx512(_mm512_loadu_ps(x + i)));
  }
  if (i < n) {
    __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, m, exp_avx512(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

AVX2 inline __m256 blend(__m256 if_false, __m256 if_true, __m256 mask) {
  return _mm256_blendv_ps(if_false, if_true, mask);
}

AVX2 inline __m256 exp_avx2(__m256 a) {
  __m256 x = _mm256_mul_ps(a, _mm256_set1_ps(kLog2e));
  __m256 r = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 tie = _mm256_cmp_ps(_mm256_sub_ps(x, r), _mm256_set1_ps(0.5f), _CMP_EQ_OQ);
  __m256 ipart = _mm256_add_ps(r, _mm256_and_ps(tie, _mm256_set1_ps(1.0f)));
  __m256 fpart = _mm256_sub_ps(x, ipart);
  __m256 p = _mm256_set1_ps(kPoly0);
  for (float c : kPoly) {
    p = _mm256_fmadd_ps(p, fpart, _mm256_set1_ps(c));
  }
  __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(ipart), _mm256_set1_epi32(127)), 23);
  __m256 result = _mm256_mul_ps(_mm256_castsi256_ps(e), p);
  result = blend(result, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  result = blend(result, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                 _mm256_cmp_ps(a, _mm256_set1_ps(88.0f), _CMP_GT_OQ));
  return blend(result, _mm256_setzero_ps(), _mm256_cmp_ps(a, _mm256_set1_ps(-88.0f), _CMP_LT_OQ));
}

AVX2 inline __m256 swiglu_avx2(__m256 g, __m256 u) {
  __m256 one = _mm256_set1_ps(1.0f);
  __m256 absg = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g);
  __m256 y = _mm256_div_ps(one, _mm256_add_ps(one, exp_avx2(absg)));
  __m256 negative = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
  __m256 s = blend(_mm256_sub_ps(one, y), y, negative);
  return _mm256_mul_ps(_mm256_mul_ps(g, s), u);
}

AVX2 void swiglu_avx2_all(const float* g, const float* u, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, swiglu_avx2(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  }
  if (i < n) { // the tail through one full vector, so it gets the same operations
    alignas(32) float gt[8] = {}, ut[8] = {}, ot[8];
    std::memcpy(gt, g + i, (n - i) * 4);
    std::memcpy(ut, u + i, (n - i) * 4);
    _mm256_store_ps(ot, swiglu_avx2(_mm256_load_ps(gt), _mm256_load_ps(ut)));
    std::memcpy(out + i, ot, (n - i) * 4);
  }
}

AVX2 void exp_avx2_all(float* x, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(x + i, exp_avx2(_mm256_loadu_ps(x + i)));
  }
  if (i < n) {
    alignas(32) float t[8] = {};
    std::memcpy(t, x + i, (n - i) * 4);
    _mm256_store_ps(t, exp_avx2(_mm256_load_ps(t)));
    std::memcpy(x + i, t, (n - i) * 4);
  }
}

#endif

} // namespace

void swiglu(const float* g, const float* u, float* out, size_t n) {
#if defined(__x86_64__)
  // The instruction set the matmul kernel uses (set_isa forces one for tests).
  const char* name = isa();
  if (std::strcmp(name, "avx512") == 0) {
    swiglu_avx512_all(g, u, out, n);
    return;
  }
  if (std::strcmp(name, "avx2") == 0) {
    swiglu_avx2_all(g, u, out, n);
    return;
  }
#endif
  swiglu_portable(g, u, out, n);
}

void exp_inplace(float* x, size_t n) {
#if defined(__x86_64__)
  const char* name = isa();
  if (std::strcmp(name, "avx512") == 0) {
    exp_avx512_all(x, n);
    return;
  }
  if (std::strcmp(name, "avx2") == 0) {
    exp_avx2_all(x, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; ++i) {
    x[i] = exp_scalar(x[i]);
  }
}

} // namespace vllm_mlx_kernels
