// Decode attention on the CPU: a few query positions per sequence (one when decoding; a
// short prefill chunk or a speculative draft's check) against its KV cache,
//   out[b, h, m] = softmax(scale * q[b, h, m] . k[b, h / G, t] (+ mask[b, h, m, t]))
//                  @ v[b, h / G, t]
// with G = Hq / Hkv query heads per KV head (grouped-query attention); with `causal`,
// query m sees keys t <= T - M + m only. What MLX's CPU scaled_dot_product_attention
// computes as ~10 graph nodes and two tiny BLAS calls per head, in one pass that reads
// each K and V row once per block of query rows, in place in the cache.
#pragma once

#include <cstdint>

namespace vllm_mlx_kernels {

enum class MaskKind { none, boolean, additive };

// K or V as a quantized KV cache keeps them (mlx-lm's QuantizedKVCache, MLX's affine
// format): each position's row of packed words (`bits` per element, element i at bits
// (i % (32 / bits)) * bits of word i / (32 / bits)) and a float32 scale and bias per
// `group_size` elements; value = scale * q + bias. Strides in elements over (batch, head,
// position); the last dimension is contiguous.
struct QuantizedRows {
  const uint32_t* words;
  int64_t words_strides[3];
  const float* scales;
  int64_t scales_strides[3];
  const float* biases;
  int64_t biases_strides[3];
};

struct AttnProblem {
  // Strides in elements over (batch, head[, position]); the last dimension is contiguous.
  // K and V are read in place: they are slices of the cache's larger buffer.
  const float* q; // (B, Hq, M, D)
  int64_t q_strides[3];
  const float* k; // (B, Hkv, T, D)
  int64_t k_strides[3];
  const float* v; // (B, Hkv, T, Dv)
  int64_t v_strides[3];
  const void* mask; // (B, Hq, M, T) of bool (false: excluded) or float32 (added), or null
  int64_t mask_strides[4]; // zero along broadcast dimensions
  MaskKind mask_kind;
  bool causal; // query m sees keys t <= T - M + m (as MLX's "causal" mask)
  float* out; // (B, Hq, M, Dv), row-major
  int B;
  int Hq;
  int Hkv;
  int M; // query positions per sequence
  int T;
  int D;
  int Dv;
  float scale;
  // A quantized cache (bits 4 or 8, group_size 32, 64 or 128): K and V are read from
  // kq and vq instead of k and v, a block of positions dequantized at a time.
  int bits = 0;
  int group_size = 0;
  QuantizedRows kq{};
  QuantizedRows vq{};
};

// Splits (batch, KV head) pairs over the matmul's thread pool when the work is large; a
// row's arithmetic never depends on the batch, the split or the thread count.
void sdpa_decode(const AttnProblem& p);

// The softmax of prefill attention over rows of scores that BLAS computed
// (scaled q against k): `rows` rows of L, row i's query position m = i % M; with
// `causal`, keys after the query (t > L - M + m) are excluded; with a bool `mask`
// ([mask_batches][M][L], false: excluded; batch i / rows_per_batch, or 0 when there is one)
// excluded keys get the float minimum as MLX's where() does. What MLX's CPU fallback does
// in ~5 single-threaded passes over the scores, in one threaded pass per row.
struct SoftmaxProblem {
  const float* scores; // [rows][L], row-major
  float* s; // the output, same shape (may be `scores`)
  int64_t rows;
  int L;
  int M;
  bool causal;
  const bool* mask; // or null
  int mask_batches; // 1: one mask for every batch row
  int64_t rows_per_batch;
};

void softmax_prefill(const SoftmaxProblem& p);

// Prefill attention fused and tiled (attn_prefill.cpp): M query positions per sequence,
//   out[b, h, m] = softmax(scale * q[b, h, m] . k[b, h / G, t], over the keys t it sees)
//                  @ v[b, h / G, t]
// where query m sees key t when t <= L - M + m (with `causal`) and mask[b][m][t] (with a
// `mask`); a query that sees no key gets the mean of V (MLX's softmax of equal minima).
// Never holds more than a block of scores; splits (batch, KV head, query block) units
// over the matmul's thread pool.
struct PrefillProblem {
  // Strides in elements over (batch, head, position); the last dimension is contiguous.
  const float* q; // (B, Hq, M, D)
  int64_t q_strides[3];
  const float* k; // (B, Hkv, L, D)
  int64_t k_strides[3];
  const float* v; // (B, Hkv, L, Dv)
  int64_t v_strides[3];
  const bool* mask; // [mask_batches][M][L], row-major (false: excluded), or null
  int mask_batches; // 1: one mask for every sequence
  bool causal;
  float* out; // (B, Hq, M, Dv), row-major
  int B;
  int Hq;
  int Hkv;
  int M;
  int L;
  int D;
  int Dv;
  float scale;
  // A quantized cache (bits 4 or 8, group_size 32, 64 or 128): K and V are read from kq
  // and vq instead of k and v, a block of keys dequantized at a time.
  int bits = 0;
  int group_size = 0;
  QuantizedRows kq{};
  QuantizedRows vq{};
};

void sdpa_prefill(const PrefillProblem& p);

} // namespace vllm_mlx_kernels
