// The row arithmetic of norm.h's ops, for other kernels that compute a norm or a rotary
// embedding inside a larger node (layer.h): the same functions, so the same bits.
#pragma once

#include <cstdint>

namespace vllm_mlx_kernels {

// One row of RMS norm, in the order of MLX's fallback graph on the CPU (see norm.cpp).
void rms_norm_row(const float* x, const float* w, float* out, int n, float eps);

struct RopeShape {
  int B, H, L, D; // x as (batch, heads, sequence, features)
  int64_t sB, sH, sL, sD; // x's strides, in elements
};

// Rotates x (any strides) into out, row-major (B, H, L, D), as mx.fast.rope.
struct RopeTask {
  RopeShape s;
  const float* x;
  float* out;
  const int32_t* offset;
  int64_t offset_stride; // 0: one offset for every batch row
  const float* freqs; // nullptr: from base
  int dims;
  bool traditional;
  float base;
  float scale;

  void operator()() const;
  void rotate(const float* row, float* o, const float* c, const float* sn, int half) const;
};

} // namespace vllm_mlx_kernels
