// Horizontal sums of AVX-512 vectors with _mm512_reduce_add_ps's exact tree, one vector
// or sixteen at once (the decode attention's scores, the matmul tiles' outputs).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace vllm_mlx_kernels {

// Internal to each includer: its AVX512 macro may name more features than another's.
namespace {

// The includer's AVX-512 target attribute (every target attribute of the kernels is a
// macro of a set the dispatch checks: tests/unit/test_isa_dispatch.py).
#ifndef AVX512
#error "define AVX512 (the file's AVX-512 target attribute) before including lanes_avx512.h"
#endif

// _mm512_reduce_add_ps's tree (GCC's and LLVM's), spelled out so that the batched form
// below provably adds the same pairs: the two 8-lane halves, then the two 4-lane halves,
// then lanes 0 + 2 and 1 + 3, then those two.
AVX512 inline float reduce_add(__m512 a) {
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
  __m256 h8 = _mm256_add_ps(hi, _mm512_castps512_ps256(a));
  __m128 h4 = _mm_add_ps(_mm256_extractf128_ps(h8, 1), _mm256_castps256_ps128(h8));
  __m128 h2 = _mm_add_ps(h4, _mm_shuffle_ps(h4, h4, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}

// Lane i = reduce_add(a[i]) bit for bit, for 16 vectors at once: each level adds the
// same pairs as reduce_add's, two vectors' halves packed into one register, so the 16
// reductions share 46 instructions instead of ~8 each (a score's sum was the costliest
// part of a decode step's attention at a 4k context: docs/benchmarks.md, round 21).
AVX512 inline __m512 reduce_add16(const __m512 a[16]) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i) { // lanes 0-7: a[i]'s 8 + 8 halves; 8-15: a[i + 8]'s
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 8], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a[i], a[i + 8], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int i = 0; i < 4; ++i) { // quads: the 4 + 4 halves of a[i], a[i + 8], a[i + 4], a[i + 12]
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[i], b[i + 4], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(b[i], b[i + 4], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  for (int i = 0; i < 2; ++i) { // per quad: lanes 0 + 2 and 1 + 3 of c[i]'s, then c[i + 2]'s
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[i], c[i + 2], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(c[i], c[i + 2], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // e holds the sums of a[0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15]; the same
  // permutation puts them back in order.
  const __m512i order = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
  return _mm512_permutexvar_ps(order, e);
}

} // namespace

} // namespace vllm_mlx_kernels

#endif // __x86_64__
