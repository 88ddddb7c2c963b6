#include "layer.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "act_kernel.h"
#include "mlx/backend/cpu/encoder.h"
#include "norm_kernel.h"
#include "qmm.h"
#include "qmm_kernel.h"
#include "strided.h"

namespace vllm_mlx_kernels {

namespace {

[[noreturn]] void refuse(const char* op, const std::string& why) {
  throw std::invalid_argument(std::string("vllm_mlx ") + op + ": " + why);
}


// x as (B, L, D) float32, and a float32 norm weight of D.
void check_hidden(const mx::array& x, const mx::array& norm_weight, const char* op) {
  if (x.dtype() != mx::float32 || x.ndim() != 3 || x.shape(1) < 1) {
    refuse(op, "x must be float32 of shape (batch, positions, hidden)");
  }
  if (norm_weight.dtype() != mx::float32 || norm_weight.ndim() != 1 ||
      norm_weight.shape(0) != x.shape(2)) {
    refuse(op, "the norm weight must be a float32 vector of x's last size");
  }
}

// Projections `first`, `first + 1`, ... of `weights` (w, scales, biases each) over K inputs.
void check_projections(const std::vector<mx::array>& weights, size_t count, int K,
                       Quantization q, const char* op) {
  if (weights.size() != 3 * count) {
    std::ostringstream msg;
    msg << "expected " << count << " projections as (w, scales, biases): " << 3 * count
        << " arrays, got " << weights.size();
    refuse(op, msg.str());
  }
  for (size_t i = 0; i < count; ++i) {
    check_weights(K, weights[3 * i], weights[3 * i + 1], weights[3 * i + 2], q.group_size,
                  q.bits, op);
  }
}

// The weights as the node's inputs: already evaluated and row-contiguous (a loaded
// model's) as they are, anything else made so.
void append_weights(std::vector<mx::array>& inputs, const std::vector<mx::array>& weights,
                    mx::StreamOrDevice s) {
  for (auto& a : weights) {
    inputs.push_back(a.is_available() && a.flags().row_contiguous ? a
                                                                  : mx::contiguous(a, false, s));
  }
}

// Between a projection's rows, (B, L, heads, hd), and the heads' layout, (B, heads, L, hd),
// both row-major: with `to_rows` from the heads' layout to rows, otherwise the other way.
void transpose_heads(const float* src, float* dst, int B, int L, int heads, int hd,
                     bool to_rows) {
  for (int b = 0; b < B; ++b) {
    for (int l = 0; l < L; ++l) {
      for (int h = 0; h < heads; ++h) {
        size_t by_rows = ((static_cast<size_t>(b) * L + l) * heads + h) * hd;
        size_t by_heads = ((static_cast<size_t>(b) * heads + h) * L + l) * hd;
        const float* from = src + (to_rows ? by_heads : by_rows);
        float* to = dst + (to_rows ? by_rows : by_heads);
        std::copy(from, from + hd, to);
      }
    }
  }
}

QmmProblem problem(const std::vector<mx::array>& inputs, size_t first, const float* x,
                   float* y, int M, int K, Quantization q, bool int8) {
  auto& w = inputs[first];
  auto& scales = inputs[first + 1];
  return QmmProblem{x, w.data<uint32_t>(), scales.data<void>(), inputs[first + 2].data<void>(),
                    y, M, w.shape(0), K, q.group_size, q.bits, scale_type(scales.dtype()),
                    int8};
}

void register_arrays(mx::cpu::CommandEncoder& encoder, const std::vector<mx::array>& inputs,
                     std::vector<mx::array>& outputs) {
  for (auto& a : inputs) {
    encoder.set_input_array(a);
  }
  for (auto& out : outputs) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    encoder.set_output_array(out);
  }
}

} // namespace

std::vector<mx::array> decoder_attention_inputs(
    const mx::array& x, const mx::array& norm_weight, float eps,
    const std::vector<mx::array>& qkv, Quantization quantization, bool int8, int n_heads,
    int n_kv_heads, int head_dim, int rope_dims, bool traditional, std::optional<float> base,
    float rope_scale, const mx::array& offset, const std::optional<mx::array>& freqs,
    mx::StreamOrDevice s) {
  const char* op = "decoder_attention_inputs";
  check_hidden(x, norm_weight, op);
  check_projections(qkv, 3, x.shape(2), quantization, op);
  if (!(eps > 0.0f)) {
    refuse(op, "eps must be positive");
  }
  if (n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 ||
      qkv[0].shape(0) != n_heads * head_dim || qkv[3].shape(0) != n_kv_heads * head_dim ||
      qkv[6].shape(0) != n_kv_heads * head_dim) {
    refuse(op, "q's outputs must be n_heads * head_dim, k's and v's n_kv_heads * head_dim");
  }
  if (rope_dims <= 0 || rope_dims % 2 != 0 || rope_dims > head_dim) {
    refuse(op, "rope dims must be even, positive and at most head_dim");
  }
  int B = x.shape(0);
  int L = x.shape(1);
  if (!mx::issubdtype(offset.dtype(), mx::integer) || offset.ndim() > 1 ||
      (offset.size() != 1 && offset.size() != static_cast<size_t>(B))) {
    refuse(op, "offset must be an integer or one integer per batch row");
  }
  if (base.has_value() == freqs.has_value()) {
    refuse(op, "exactly one of base and freqs must be given");
  }
  if (freqs && (freqs->ndim() != 1 || freqs->shape(0) != rope_dims / 2)) {
    refuse(op, "freqs must be a vector of rope dims / 2 values");
  }
  auto stream = cpu_stream(s, op);
  std::vector<mx::array> inputs{x, norm_weight, mx::astype(offset, mx::int32, s)};
  if (freqs) {
    inputs.push_back(mx::astype(*freqs, mx::float32, s));
  }
  append_weights(inputs, qkv, s);
  DecoderAttentionInputs::Rope rope{rope_dims, traditional, base.value_or(1.0f), rope_scale,
                                    freqs.has_value()};
  auto primitive =
      std::make_shared<DecoderAttentionInputs>(stream, eps, quantization, int8, rope);
  return mx::array::make_arrays(
      {{B, n_heads, L, head_dim}, {B, n_kv_heads, L, head_dim}, {B, n_kv_heads, L, head_dim}},
      {mx::float32, mx::float32, mx::float32}, std::move(primitive), std::move(inputs));
}

void DecoderAttentionInputs::eval_cpu(const std::vector<mx::array>& inputs,
                                      std::vector<mx::array>& outputs) {
  auto& encoder = mx::cpu::get_command_encoder(stream());
  register_arrays(encoder, inputs, outputs);
  auto& x = inputs[0];
  auto& offset = inputs[2];
  size_t first = rope_.has_freqs ? 4 : 3;
  int B = x.shape(0);
  int L = x.shape(1);
  int D = x.shape(2);
  int H = outputs[0].shape(1);
  int KV = outputs[1].shape(1);
  int hd = outputs[0].shape(3);
  int rows = B * L; // the projections' rows: position l of sequence b is row b * L + l
  auto xr = row_major(x, encoder);
  auto wr = row_major(inputs[1], encoder);
  auto fr = rope_.has_freqs ? row_major(inputs[3], encoder) : RowMajor{nullptr, {}};
  // q and k before their rotation, (rows, heads * head_dim) each. At one position v goes
  // straight into its output ((B, heads, 1, head_dim) row-major is (B, heads * head_dim));
  // at several it is made (rows, heads * head_dim) first and then moved to (B, heads, L,
  // head_dim), as mlx_lm's reshape and transpose place it (copies: the same floats).
  size_t v_floats = L == 1 ? 0 : static_cast<size_t>(rows) * KV * hd;
  float* normed = temporary_floats(
      static_cast<size_t>(rows) * (D + (H + KV) * hd) + v_floats, encoder);
  float* q = normed + static_cast<size_t>(rows) * D;
  float* k = q + static_cast<size_t>(rows) * H * hd;
  float* v_out = outputs[2].data<float>();
  float* v = L == 1 ? v_out : k + static_cast<size_t>(rows) * KV * hd;
  auto projection = [&](size_t at, float* y) {
    return problem(inputs, at, normed, y, rows, D, quantization_, int8_);
  };
  std::vector<QmmProblem> problems{projection(first, q), projection(first + 3, k),
                                   projection(first + 6, v)};
  auto rotation = [&](const float* src, float* dst, int heads) {
    int64_t row = static_cast<int64_t>(heads) * hd;
    return RopeTask{{B, heads, L, hd, L * row, hd, row, 1}, src, dst, offset.data<int32_t>(),
                    offset.size() == 1 ? 0 : offset.strides()[0], nullptr, rope_.dims,
                    rope_.traditional, rope_.base, rope_.scale};
  };
  auto rope_q = rotation(q, outputs[0].data<float>(), H);
  auto rope_k = rotation(k, outputs[1].data<float>(), KV);
  encoder.dispatch([xr, wr, fr, normed, problems = std::move(problems), rope_q, rope_k, v,
                    v_out, rows, B, L, KV, hd, D, eps = eps_]() mutable {
    for (auto* in : {&xr, &wr, &fr}) {
      if (in->fill) {
        in->fill();
      }
    }
    for (int r = 0; r < rows; ++r) {
      rms_norm_row(xr.data + static_cast<size_t>(r) * D, wr.data,
                   normed + static_cast<size_t>(r) * D, D, eps);
    }
    qmm_many(problems.data(), static_cast<int>(problems.size()));
    rope_q.freqs = rope_k.freqs = fr.data;
    rope_q();
    rope_k();
    if (v != v_out) {
      transpose_heads(v, v_out, B, L, KV, hd, false);
    }
  });
}

void DecoderAttentionInputs::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("VllmMlxDecoderAttentionInputs runs on the CPU only");
}

mx::array decoder_mlp_residual(
    const mx::array& attention, const mx::array& x, const std::vector<mx::array>& o,
    Quantization o_quantization, const mx::array& norm_weight, float eps,
    const std::vector<mx::array>& gate_up, Quantization gate_up_quantization,
    const std::vector<mx::array>& down, Quantization down_quantization, bool int8,
    mx::StreamOrDevice s) {
  const char* op = "decoder_mlp_residual";
  check_hidden(x, norm_weight, op);
  if (attention.dtype() != mx::float32 || attention.ndim() != 4 ||
      attention.shape(2) != x.shape(1) || attention.shape(0) != x.shape(0)) {
    refuse(op,
           "attention must be float32 (batch, heads, positions, head_dim), x's batch and "
           "positions");
  }
  if (!(eps > 0.0f)) {
    refuse(op, "eps must be positive");
  }
  int D = x.shape(2);
  check_projections(o, 1, attention.shape(1) * attention.shape(3), o_quantization, op);
  if (o[0].shape(0) != D) {
    refuse(op, "o's outputs must be x's last size");
  }
  check_projections(gate_up, 2, D, gate_up_quantization, op);
  int F = gate_up[0].shape(0);
  if (gate_up[3].shape(0) != F) {
    refuse(op, "gate and up must have as many outputs");
  }
  check_projections(down, 1, F, down_quantization, op);
  if (down[0].shape(0) != D) {
    refuse(op, "down's outputs must be x's last size");
  }
  auto stream = cpu_stream(s, op);
  std::vector<mx::array> inputs{attention, x, norm_weight};
  append_weights(inputs, o, s);
  append_weights(inputs, gate_up, s);
  append_weights(inputs, down, s);
  auto primitive = std::make_shared<DecoderMlpResidual>(
      stream, eps, o_quantization, gate_up_quantization, down_quantization, int8);
  return mx::array(x.shape(), mx::float32, std::move(primitive), std::move(inputs));
}

void DecoderMlpResidual::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& encoder = mx::cpu::get_command_encoder(stream());
  std::vector<mx::array> outputs{out};
  register_arrays(encoder, inputs, outputs);
  auto& attention = inputs[0];
  auto& x = inputs[1];
  int L = x.shape(1);
  int B = x.shape(0) * L; // rows: position l of sequence b is row b * L + l
  int D = x.shape(2);
  int heads = attention.shape(1);
  int hd = attention.shape(3);
  int A = heads * hd;
  int F = inputs[6].shape(0);
  auto ar = row_major(attention, encoder);
  auto xr = row_major(x, encoder);
  auto wr = row_major(inputs[2], encoder);
  // h, the normed h, and the gate and up products (B rows each); the down product goes
  // to the output, which then gets h added in place. At several positions the attention
  // is moved from (batch, heads, L, hd) to rows first, as mlx_lm's transpose and reshape
  // copy it.
  size_t moved = L == 1 ? 0 : static_cast<size_t>(B) * A;
  float* h = temporary_floats(static_cast<size_t>(B) * (2 * D + 2 * F) + moved, encoder);
  float* normed = h + static_cast<size_t>(B) * D;
  float* gate = normed + static_cast<size_t>(B) * D;
  float* up = gate + static_cast<size_t>(B) * F;
  float* y = out.data<float>();
  float* rows = L == 1 ? nullptr : up + static_cast<size_t>(B) * F;
  QmmProblem o = problem(inputs, 3, rows ? rows : ar.data, h, B, A, o_, int8_);
  std::vector<QmmProblem> gate_up{problem(inputs, 6, normed, gate, B, D, gate_up_, int8_),
                                  problem(inputs, 9, normed, up, B, D, gate_up_, int8_)};
  QmmProblem down = problem(inputs, 12, gate, y, B, F, down_, int8_);
  encoder.dispatch([ar, xr, wr, o, gate_up = std::move(gate_up), down, h, normed, gate, up,
                    y, rows, B, L, D, F, heads, hd, eps = eps_]() mutable {
    for (auto* in : {&ar, &xr, &wr}) {
      if (in->fill) {
        in->fill();
      }
    }
    if (rows != nullptr) {
      transpose_heads(ar.data, rows, B / L, L, heads, hd, true);
    }
    qmm(o); // h = o(attention) ...
    size_t hidden = static_cast<size_t>(B) * D;
    for (size_t i = 0; i < hidden; ++i) {
      h[i] = xr.data[i] + h[i]; // ... + x: the residual, as `x + r`
    }
    for (int b = 0; b < B; ++b) {
      rms_norm_row(h + static_cast<size_t>(b) * D, wr.data, normed + static_cast<size_t>(b) * D,
                   D, eps);
    }
    qmm_many(gate_up.data(), static_cast<int>(gate_up.size()));
    swiglu(gate, up, gate, static_cast<size_t>(B) * F);
    qmm(down);
    for (size_t i = 0; i < hidden; ++i) {
      y[i] = h[i] + y[i]; // `h + r`
    }
  });
}

void DecoderMlpResidual::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("VllmMlxDecoderMlpResidual runs on the CPU only");
}

} // namespace vllm_mlx_kernels
