// What the instruction-set-specific tiles (qmm_avx2.cpp, qmm_avx512.cpp, qmm_neon.cpp)
// share with the dispatcher in qmm_kernel.cpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "qmm_kernel.h"

namespace vllm_mlx_kernels {

// Storage aligned to a cache line: the tiles read activations 64 bytes at a time, and an
// AVX-512 load that straddles two lines costs two of the core's load slots.
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* at, size_t) {
    ::operator delete(at, std::align_val_t{64});
  }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
};

// The activations the kernels read: x reordered to match how weights unpack (4-bit
// kernels unpack a chunk of 2 * `block` weights as the low nibbles, then the high ones;
// block 8 for AVX2 and NEON, 16 for AVX-512, 0: natural order), and x's sum over each group (the
// bias term is b[n, g] * sum of x over group g).
struct Prepared {
  std::vector<float, CacheLineAllocator<float>> x;
  std::vector<float> sums;
};

// The activations of the int8 tiles (qmm_int8.h): x rounded to int8 per 32 values
// (scale max|x| / 127), laid out chunk by chunk as a chunk of 64 weight bytes pairs with
// it, with each vpdpbusd lane's activation scale, and the rounded activations' sum over
// each weight group (for the bias term).
struct PreparedInt8 {
  // [M, chunks, chunk_bytes]; 4 bits: 64 even then 64 odd values
  std::vector<int8_t, CacheLineAllocator<int8_t>> q;
  // [M, chunks, 16]: the scale of lane L's activations (0 past K)
  std::vector<float, CacheLineAllocator<float>> dx;
  std::vector<float> sums; // [M, K / group_size]: sum of dx * q over the group
  int chunks = 0;
  int chunk_bytes = 0; // 128 at 4 bits, 64 at 8
};

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float half_to_float(uint16_t h);

// How far ahead (bytes) the tiles prefetch the weights they will read; 0: off. A tile
// reads its rows interleaved (64 bytes of each of 8 rows, then the next 64 of each), and
// such short strided streams defeat the hardware prefetcher: on Zen 4 a plain loop over
// 32 MiB read that way streams 11-13 GB/s against 23-25 in order. Asking for the bytes
// into L2 in the order they lie, this far ahead, brings it back (docs/benchmarks.md
// "Round 9"). Atomic: benchmarks change it while MLX streams may be running matmuls.
extern std::atomic<long> g_prefetch_distance;

// Prefetches into L2 the lines of tile bytes [begin, end) (offsets from the tile's first
// weight byte, rows lying one after another) `distance` bytes on: each line once, however
// the caller steps through the tile.
inline void prefetch_ahead(const void* tile, size_t begin, size_t end, long distance) {
  if (distance <= 0) {
    return;
  }
  // Integer arithmetic: the lines ahead may lie past the array (a prefetch never faults).
  const uintptr_t base = reinterpret_cast<uintptr_t>(tile) + static_cast<uintptr_t>(distance);
  for (size_t at = (begin + 63) & ~size_t{63}; at < end; at += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(base + at), 0, 2);
  }
}

// Output rows [n_begin, n_end) of y, per instruction set. n_begin is a multiple of 4.
void rows_avx2(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end);
void rows_avx512(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end);
void rows_neon(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end);

// The int8 tiles (x86-64 only, qmm_int8.h) and their activations: AVX-512 VNNI, AVX2.
void prepare_int8_vnni(const QmmProblem& p, PreparedInt8& out);
void rows_int8_vnni(const QmmProblem& p, const PreparedInt8& xp, int n_begin, int n_end);
void prepare_int8_avx2(const QmmProblem& p, PreparedInt8& out);
void rows_int8_avx2(const QmmProblem& p, const PreparedInt8& xp, int n_begin, int n_end);

// The row loop of the instruction set with 4-row tiles (NEON; AVX2's until round 25): one activation row
// takes 4 output rows at a time; several take one output row and up to 4 activation rows.
// `Tiles::run<BITS, MT, NT, ST>(p, xp, m0, n0)` computes one MT x NT tile.
template <class Tiles, int BITS, ScaleType ST>
void rows_by_4_tiles(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  if (p.M == 1) {
    int n = n_begin;
    for (; n + 4 <= n_end; n += 4) {
      Tiles::template run<BITS, 1, 4, ST>(p, xp, 0, n);
    }
    for (; n < n_end; ++n) {
      Tiles::template run<BITS, 1, 1, ST>(p, xp, 0, n);
    }
    return;
  }
  for (int n = n_begin; n < n_end; ++n) {
    int m = 0;
    for (; m + 4 <= p.M; m += 4) {
      Tiles::template run<BITS, 4, 1, ST>(p, xp, m, n);
    }
    switch (p.M - m) {
      case 3: Tiles::template run<BITS, 3, 1, ST>(p, xp, m, n); break;
      case 2: Tiles::template run<BITS, 2, 1, ST>(p, xp, m, n); break;
      case 1: Tiles::template run<BITS, 1, 1, ST>(p, xp, m, n); break;
      default: break;
    }
  }
}

// rows_by_4_tiles for the problem's bits and scale type.
template <class Tiles>
void rows_with_tiles(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  auto typed = [&](auto bits) {
    constexpr int B = decltype(bits)::value;
    auto rows = [&]<ScaleType ST>() { rows_by_4_tiles<Tiles, B, ST>(p, xp, n_begin, n_end); };
    switch (p.scale_type) {
      case ScaleType::f32: rows.template operator()<ScaleType::f32>(); break;
      case ScaleType::f16: rows.template operator()<ScaleType::f16>(); break;
      case ScaleType::bf16: rows.template operator()<ScaleType::bf16>(); break;
    }
  };
  if (p.bits == 4) {
    typed(std::integral_constant<int, 4>{});
  } else {
    typed(std::integral_constant<int, 8>{});
  }
}

} // namespace vllm_mlx_kernels
