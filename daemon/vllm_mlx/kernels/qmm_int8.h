// What the two sets of int8 tiles share: AVX-512 VNNI (qmm_vnni.cpp) and AVX2
// (qmm_int8_avx2.cpp). x is rounded to int8 per 32 values and laid out chunk by chunk as
// a chunk of 64 weight bytes pairs with it; a 32-bit lane L of a chunk (VNNI: lane L of
// one zmm; AVX2: lane L % 8 of half L / 8) sums the products of bytes 4L..4L+3, which lie
// in one 32-value activation block and one weight group.
#pragma once

#include <cstdint>

#include "qmm_internal.h"

namespace vllm_mlx_kernels {

// The weight offset (within its 64-byte chunk) of lane L's first weight: 4-bit bytes hold
// two weights (low nibbles against the even activations, high nibbles against the odd).
constexpr int int8_lane_offset(int bits, int lane) {
  return bits == 4 ? 8 * lane : 4 * lane;
}

// One block of 32 activations rounded to int8 (to nearest even, times 127 / max|x|,
// clamped to [-127, 127]); returns the block's scale max|x| / 127. Each set supplies its
// own; they must round alike.
using QuantizeBlock = float (*)(const float* src, int8_t* out);

// x of every row laid out for the int8 tiles, each block rounded by `quantize`.
void prepare_int8_with(const QmmProblem& p, PreparedInt8& out, QuantizeBlock quantize);

// The row loop of both sets. One activation row: Tiles::kDecodeRows output rows a tile
// (independent chains that hide the latency of the multiply-adds).
// Several: 4 activation rows x Tiles::kBatchOutputs output rows, the unpacked weights
// shared by the 4; the last 1-3 rows in one tile, so the weights are read once more, not up to 3
// times. `Tiles::run<BITS, ST, MT, NT>(p, xp, m0, n0)` computes one MT x NT tile; every
// output must be the same sequence of operations whatever the tile (batch invariance).
template <class Tiles, int BITS, ScaleType ST>
void rows_int8_tiles(const QmmProblem& p, const PreparedInt8& xp, int n_begin, int n_end) {
  if (p.M == 1) {
    constexpr int rows = Tiles::kDecodeRows;
    int n = n_begin;
    for (; n + rows <= n_end; n += rows) {
      Tiles::template run<BITS, ST, 1, rows>(p, xp, 0, n);
    }
    for (; n < n_end; ++n) {
      Tiles::template run<BITS, ST, 1, 1>(p, xp, 0, n);
    }
    return;
  }
  auto for_rows = [&]<int NT>(int at) {
    int m = 0;
    for (; m + 4 <= p.M; m += 4) {
      Tiles::template run<BITS, ST, 4, NT>(p, xp, m, at);
    }
    switch (p.M - m) {
      case 3: Tiles::template run<BITS, ST, 3, NT>(p, xp, m, at); break;
      case 2: Tiles::template run<BITS, ST, 2, NT>(p, xp, m, at); break;
      case 1: Tiles::template run<BITS, ST, 1, NT>(p, xp, m, at); break;
      default: break;
    }
  };
  constexpr int outputs = Tiles::kBatchOutputs;
  int n = n_begin;
  for (; n + outputs <= n_end; n += outputs) {
    for_rows.template operator()<outputs>(n);
  }
  for (; n < n_end; ++n) {
    for_rows.template operator()<1>(n);
  }
}

// rows_int8_tiles for the problem's bits and scale type.
template <class Tiles>
void rows_int8_with(const QmmProblem& p, const PreparedInt8& xp, int n_begin, int n_end) {
  auto typed = [&]<int BITS>() {
    switch (p.scale_type) {
      case ScaleType::f32: rows_int8_tiles<Tiles, BITS, ScaleType::f32>(p, xp, n_begin, n_end); break;
      case ScaleType::f16: rows_int8_tiles<Tiles, BITS, ScaleType::f16>(p, xp, n_begin, n_end); break;
      case ScaleType::bf16: rows_int8_tiles<Tiles, BITS, ScaleType::bf16>(p, xp, n_begin, n_end); break;
    }
  };
  if (p.bits == 4) {
    typed.template operator()<4>();
  } else {
    typed.template operator()<8>();
  }
}

} // namespace vllm_mlx_kernels
