// A Llama-style decoder layer's decode step (or a short chunk's) in three graph nodes
// around the KV cache.
//
// One decode step of the bundled model was 762 graph nodes, ~25 a layer (norms, the
// q/k/v and gate/up products, reshapes and transposes, two rotary embeddings, the o and
// down products, SwiGLU, two residual adds), and at one stream each node costs more in
// bookkeeping and Python graph building (~7 us) than its arithmetic (docs/benchmarks.md,
// round 12). These ops compute the same layer in two nodes, one on each side of the
// cache update and attention, which stay where they are (mlx-lm's cache, the decode
// kernel of attn.h). Inside, they call the very row functions the one-op-per-node path
// calls (rms_norm_row, qmm_many / qmm, RopeTask, swiglu), in the same order on the same
// floats: the same bits, so a model's greedy output does not change.
#pragma once

#include <optional>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace vllm_mlx_kernels {

namespace mx = mlx::core;

// One projection's quantization, as QuantizedLinear holds it.
struct Quantization {
  int group_size;
  int bits;
};

// rope(q), rope(k), v of a decoder layer at L positions per row (1 when decoding, a few
// for a prompt's chunk or a draft's check): x is (B, L, D) float32, qkv the q, k and v
// projections' (w, scales, biases), nine arrays, quantized alike; position l of row b
// rotates at offset[b] + l. Returns q (B, n_heads, L, head_dim), k and v (B, n_kv_heads,
// L, head_dim), as mlx_lm's Attention has them after its reshapes, transposes and rotary
// embedding. The projections take B * L rows in one call: the caller keeps that within
// the rows the kernel serves (past them the one-op path takes dequantize + BLAS).
std::vector<mx::array> decoder_attention_inputs(
    const mx::array& x, const mx::array& norm_weight, float eps,
    const std::vector<mx::array>& qkv, Quantization quantization, bool int8, int n_heads,
    int n_kv_heads, int head_dim, int rope_dims, bool traditional, std::optional<float> base,
    float rope_scale, const mx::array& offset, const std::optional<mx::array>& freqs,
    mx::StreamOrDevice s = {});

// h + down(swiglu(gate(n), up(n))), n = rms_norm(h), h = x + o(attention): the rest of the
// layer. attention is (B, n_heads, L, head_dim), x (B, L, D); o, gate_up (gate then up)
// and down are (w, scales, biases) arrays.
mx::array decoder_mlp_residual(
    const mx::array& attention, const mx::array& x, const std::vector<mx::array>& o,
    Quantization o_quantization, const mx::array& norm_weight, float eps,
    const std::vector<mx::array>& gate_up, Quantization gate_up_quantization,
    const std::vector<mx::array>& down, Quantization down_quantization, bool int8,
    mx::StreamOrDevice s = {});

class DecoderAttentionInputs : public mx::Primitive {
 public:
  struct Rope {
    int dims;
    bool traditional;
    float base; // unused with freqs (an input)
    float scale;
    bool has_freqs;
  };
  DecoderAttentionInputs(mx::Stream stream, float eps, Quantization q, bool int8, Rope rope)
      : mx::Primitive(stream), eps_(eps), quantization_(q), int8_(int8), rope_(rope) {}

  // inputs: x, norm weight, offset (int32), [freqs], then q, k, v's (w, scales, biases).
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override {
    return "VllmMlxDecoderAttentionInputs";
  }
  bool is_equivalent(const mx::Primitive&) const override {
    return false; // never merged: each layer's node has its own weights anyway
  }

 private:
  float eps_;
  Quantization quantization_;
  bool int8_;
  Rope rope_;
};

class DecoderMlpResidual : public mx::UnaryPrimitive {
 public:
  DecoderMlpResidual(mx::Stream stream, float eps, Quantization o, Quantization gate_up,
                     Quantization down, bool int8)
      : mx::UnaryPrimitive(stream), eps_(eps), o_(o), gate_up_(gate_up), down_(down),
        int8_(int8) {}

  // inputs: attention, x, norm weight, then o's, gate's, up's and down's (w, scales, biases).
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override {
    return "VllmMlxDecoderMlpResidual";
  }
  bool is_equivalent(const mx::Primitive&) const override {
    return false;
  }

 private:
  float eps_;
  Quantization o_;
  Quantization gate_up_;
  Quantization down_;
  bool int8_;
};

} // namespace vllm_mlx_kernels
