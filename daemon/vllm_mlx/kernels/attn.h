// The MLX side of the decode attention in attn_kernel.h: an op that builds a graph node.
#pragma once

#include <optional>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace vllm_mlx_kernels {

namespace mx = mlx::core;

// The most query positions sdpa_decode takes: its scratch per (sequence, KV head) holds
// every row's scores; sdpa_prefill's tiles serve more.
constexpr int kMaxDecodeQueries = 64;

// mx.fast.scaled_dot_product_attention(q, k, v, scale, mask) for a few query positions
// (one when decoding): float32 q (B, Hq, M, D) with 1 <= M <= 64, k (B, Hkv, T, D), v (B,
// Hkv, T, Dv), Hq a multiple of Hkv, and mask None, bool (false: excluded) or additive,
// broadcastable to (B, Hq, M, T); or `causal` (no mask): query m sees keys up to T - M + m.
// Returns (B, Hq, M, Dv) float32. std::invalid_argument for anything else.
mx::array sdpa_decode(
    const mx::array& q,
    const mx::array& k,
    const mx::array& v,
    float scale,
    const std::optional<mx::array>& mask = std::nullopt,
    bool causal = false,
    mx::StreamOrDevice s = {});

// sdpa_decode over a quantized KV cache, read in place: k and v are MLX's affine triples
// (uint32 words (B, Hkv, T, D * bits / 32), float32 scales and biases (B, Hkv, T, D /
// group_size)) as mlx-lm's QuantizedKVCache keeps them; bits 4 or 8, group_size 32, 64 or
// 128. q, mask and causal as sdpa_decode's. What mlx_lm's
// quantized_scaled_dot_product_attention computes with MLX's CPU quantized matmul.
mx::array sdpa_decode_quantized(
    const mx::array& q,
    const std::vector<mx::array>& k,
    const std::vector<mx::array>& v,
    float scale,
    int group_size,
    int bits,
    const std::optional<mx::array>& mask = std::nullopt,
    bool causal = false,
    mx::StreamOrDevice s = {});

// sdpa_decode for one query position after appending that position's K and V to the
// cache: k and v (B, Hkv, 1, D / Dv) are written at `position` of k_cache (B, Hkv, S, D)
// and v_cache (B, Hkv, S, Dv), 0 <= position < S, then q (B, Hq, 1, D) attends to
// positions 0..position of them (the bits sdpa_decode gives over the cache's slice up to
// there), with mask as sdpa_decode's over those position + 1 keys. Returns (attention,
// k_cache', v_cache'): the new caches take the old ones' buffers when nothing else holds
// them (as MLX's slice update does), else copies. What mlx_lm's cache update (two slice
// updates, two slices) and the attention call compute, in one node.
std::vector<mx::array> sdpa_decode_append(
    const mx::array& q,
    const mx::array& k,
    const mx::array& v,
    const mx::array& k_cache,
    const mx::array& v_cache,
    int position,
    float scale,
    const std::optional<mx::array>& mask = std::nullopt,
    mx::StreamOrDevice s = {});

// softmax over the last axis of float32 prefill scores (B, Hkv, R, L) where row r's query
// position is r % M (grouped heads stacked along R); `causal` excludes keys after the
// query, `mask` (bool (B or 1, 1, M, L); false: excluded) too. Returns a new array.
mx::array softmax_prefill(
    const mx::array& scores,
    int M,
    bool causal,
    const std::optional<mx::array>& mask = std::nullopt,
    mx::StreamOrDevice s = {});

// mx.fast.scaled_dot_product_attention(q, k, v, scale, mask) for several query positions,
// fused (no score matrix in memory): float32 q (B, Hq, M, D), k (B, Hkv, L, D), v (B, Hkv,
// L, Dv), Hq a multiple of Hkv; `causal`: query m sees keys up to L - M + m; `mask`: bool
// (B or 1, 1, M, L), false: excluded. Returns (B, Hq, M, Dv) float32.
// std::invalid_argument for anything else.
mx::array sdpa_prefill(
    const mx::array& q,
    const mx::array& k,
    const mx::array& v,
    float scale,
    bool causal,
    const std::optional<mx::array>& mask = std::nullopt,
    mx::StreamOrDevice s = {});

// sdpa_prefill over a quantized KV cache, read in place a block of keys at a time: k and
// v are MLX's affine triples as sdpa_decode_quantized takes them; q, causal and mask as
// sdpa_prefill's. The bits of sdpa_prefill over the dequantized K and V.
mx::array sdpa_prefill_quantized(
    const mx::array& q,
    const std::vector<mx::array>& k,
    const std::vector<mx::array>& v,
    float scale,
    int group_size,
    int bits,
    bool causal,
    const std::optional<mx::array>& mask = std::nullopt,
    mx::StreamOrDevice s = {});

class PrefillAttention : public mx::UnaryPrimitive {
 public:
  // bits 0: float32 K and V; 4 or 8: quantized triples (sdpa_prefill_quantized).
  PrefillAttention(mx::Stream stream, float scale, bool causal, int bits = 0,
                   int group_size = 0)
      : mx::UnaryPrimitive(stream),
        scale_(scale),
        causal_(causal),
        bits_(bits),
        group_size_(group_size) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "VllmMlxPrefillAttention";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const PrefillAttention&>(other);
    return scale_ == o.scale_ && causal_ == o.causal_ && bits_ == o.bits_ &&
           group_size_ == o.group_size_;
  }

 private:
  void eval_quantized(const std::vector<mx::array>& inputs, mx::array& out);

  float scale_;
  bool causal_;
  int bits_;
  int group_size_;
};

class PrefillSoftmax : public mx::UnaryPrimitive {
 public:
  PrefillSoftmax(mx::Stream stream, int M, bool causal)
      : mx::UnaryPrimitive(stream), M_(M), causal_(causal) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "VllmMlxPrefillSoftmax";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const PrefillSoftmax&>(other);
    return M_ == o.M_ && causal_ == o.causal_;
  }

 private:
  int M_;
  bool causal_;
};

class DecodeAttention : public mx::UnaryPrimitive {
 public:
  // bits 0: float32 K and V; 4 or 8: quantized triples (sdpa_decode_quantized).
  DecodeAttention(mx::Stream stream, float scale, bool causal, int bits = 0, int group_size = 0)
      : mx::UnaryPrimitive(stream),
        scale_(scale),
        causal_(causal),
        bits_(bits),
        group_size_(group_size) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

  const char* name() const override {
    return "VllmMlxDecodeAttention";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const DecodeAttention&>(other);
    return scale_ == o.scale_ && causal_ == o.causal_ && bits_ == o.bits_ &&
           group_size_ == o.group_size_;
  }

 private:
  void eval_quantized(const std::vector<mx::array>& inputs, mx::array& out);

  float scale_;
  bool causal_;
  int bits_;
  int group_size_;
};

class DecodeAppendAttention : public mx::Primitive {
 public:
  DecodeAppendAttention(mx::Stream stream, int position, float scale)
      : mx::Primitive(stream), position_(position), scale_(scale) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;

  const char* name() const override {
    return "VllmMlxDecodeAppendAttention";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const DecodeAppendAttention&>(other);
    return position_ == o.position_ && scale_ == o.scale_;
  }

 private:
  int position_;
  float scale_;
};

} // namespace vllm_mlx_kernels
