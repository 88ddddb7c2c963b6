#include "attn.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "attn_graph.h"
#include "attn_kernel.h"
#include "mlx/backend/cpu/encoder.h"
#include "strided.h"

namespace vllm_mlx_kernels {

using namespace attn_graph;

namespace {

// The problem `msg` names, if any, as op's std::invalid_argument; else the CPU stream
// (another device's is refused: these ops run on the CPU only).
mx::Stream cpu_stream(const std::ostringstream& msg, const char* op, mx::StreamOrDevice s) {
  if (!msg.str().empty()) {
    throw std::invalid_argument(std::string("vllm_mlx ") + op + ": " + msg.str());
  }
  return vllm_mlx_kernels::cpu_stream(s, op); // strided.h's (this overload hides it)
}

// What is wrong with k and v as quantized triples for q's batch, heads and head dim (the
// first problem found), or nothing: bits 4 or 8, groups of 32, 64 or 128, MLX's layout.
void check_quantized_kv(std::ostringstream& msg, const mx::array& q,
                        const std::vector<mx::array>& k, const std::vector<mx::array>& v,
                        int group_size, int bits) {
  auto triple_ok = [&](const std::vector<mx::array>& t) {
    return t.size() == 3 && t[0].dtype() == mx::uint32 && t[1].dtype() == mx::float32 &&
           t[2].dtype() == mx::float32 && t[0].ndim() == 4 && t[1].ndim() == 4 &&
           t[2].ndim() == 4 && t[1].shape() == t[2].shape() &&
           t[0].shape(0) == t[1].shape(0) && t[0].shape(1) == t[1].shape(1) &&
           t[0].shape(2) == t[1].shape(2);
  };
  if (!triple_ok(k) || !triple_ok(v)) {
    msg << "k and v must each be (uint32 words, float32 scales, float32 biases), 4-D, "
        << "one (batch, heads, positions)";
  } else if (k[0].shape(0) != q.shape(0) || v[0].shape(0) != q.shape(0)) {
    msg << "q, k and v must have one batch size";
  } else if (k[0].shape(1) != v[0].shape(1) || q.shape(1) % k[0].shape(1) != 0) {
    msg << "k and v must have one head count that divides q's (" << q.shape(1) << ")";
  } else if (k[0].shape(2) != v[0].shape(2) || k[0].shape(2) < 1) {
    msg << "k and v must have one length of at least 1";
  } else if (static_cast<int64_t>(k[0].shape(3)) * 32 / bits != q.shape(3) ||
             q.shape(3) % group_size != 0 || k[1].shape(3) != q.shape(3) / group_size) {
    msg << "k's words, scales and biases must hold q's head dim (" << q.shape(3) << ") at "
        << bits << " bits in groups of " << group_size;
  } else if (v[0].shape(3) < 1 || (v[0].shape(3) * 32 / bits) % group_size != 0 ||
             v[1].shape(3) != v[0].shape(3) * 32 / bits / group_size) {
    msg << "v's words, scales and biases must hold whole groups of " << group_size;
  }
}

void check_bits(std::ostringstream& msg, int group_size, int bits) {
  if (bits != 4 && bits != 8) {
    msg << "bits must be 4 or 8, not " << bits;
  } else if (group_size != 32 && group_size != 64 && group_size != 128) {
    msg << "group_size must be 32, 64 or 128, not " << group_size;
  }
}

// A prefill mask: bool (1 or the batch, 1, queries, keys).
bool prefill_mask_ok(const std::optional<mx::array>& mask, int B, int M, int L) {
  return !mask || (mask->dtype() == mx::bool_ && mask->ndim() == 4 && mask->shape(1) == 1 &&
                   mask->shape(2) == M && mask->shape(3) == L &&
                   (mask->shape(0) == 1 || mask->shape(0) == B));
}

QuantizedRows quantized_rows(const Rows<uint32_t>& w, const Rows<float>& s,
                             const Rows<float>& b) {
  return {w.data, {w.strides[0], w.strides[1], w.strides[2]},
          s.data, {s.strides[0], s.strides[1], s.strides[2]},
          b.data, {b.strides[0], b.strides[1], b.strides[2]}};
}

// A quantized op's K and V (inputs 1-3 and 4-6: words, scales, biases) as the kernels
// read them.
struct QuantizedKV {
  Rows<uint32_t> kw, vw;
  Rows<float> ks, kb, vs, vb;
  QuantizedKV(const std::vector<mx::array>& inputs, mx::cpu::CommandEncoder& encoder)
      : kw(rows_of<uint32_t>(inputs[1], encoder)),
        vw(rows_of<uint32_t>(inputs[4], encoder)),
        ks(rows_of<float>(inputs[2], encoder)),
        kb(rows_of<float>(inputs[3], encoder)),
        vs(rows_of<float>(inputs[5], encoder)),
        vb(rows_of<float>(inputs[6], encoder)) {}
  QuantizedRows keys() const { return quantized_rows(kw, ks, kb); }
  QuantizedRows values() const { return quantized_rows(vw, vs, vb); }
  void fill() const { fill_all(kw, ks, kb, vw, vs, vb); }
};

// What the float and quantized prefill problems share: q, the mask (inputs[mask_at], if
// there), the causal flag, the output and the sizes; K's heads and positions from `kv`
// (K itself, or its packed words).
void set_shared(PrefillProblem& p, const Rows<float>& qv, const std::vector<mx::array>& inputs,
                size_t mask_at, const mx::array& kv, mx::array& out, float scale, bool causal) {
  const auto& q = inputs[0];
  p.q = qv.data;
  std::copy(qv.strides, qv.strides + 3, p.q_strides);
  p.mask = inputs.size() > mask_at ? inputs[mask_at].data<bool>() : nullptr;
  p.mask_batches = inputs.size() > mask_at ? inputs[mask_at].shape(0) : 1;
  p.causal = causal;
  p.out = out.data<float>();
  p.B = q.shape(0);
  p.Hq = q.shape(1);
  p.Hkv = kv.shape(1);
  p.M = q.shape(2);
  p.L = kv.shape(2);
  p.D = q.shape(3);
  p.Dv = out.shape(3);
  p.scale = scale;
}

// A quantized op's task (inputs: q, K's and V's words, scales and biases, then the mask):
// the problem set up from them, filled in the task, then `run`.
template <class Problem>
void dispatch_quantized(mx::Stream stream, const std::vector<mx::array>& inputs, mx::array& out,
                        float scale, bool causal, int bits, int group_size,
                        void (*run)(const Problem&)) {
  auto& encoder = mx::cpu::get_command_encoder(stream);
  auto qv = rows_of<float>(inputs[0], encoder);
  const QuantizedKV kv(inputs, encoder);
  Problem p{};
  set_shared(p, qv, inputs, 7, inputs[1], out, scale, causal);
  p.kq = kv.keys();
  p.vq = kv.values();
  p.bits = bits;
  p.group_size = group_size;
  encoder.dispatch([p, qv, kv, run]() {
    fill_all(qv);
    kv.fill();
    run(p);
  });
}

} // namespace

mx::array sdpa_decode(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                      const std::optional<mx::array>& mask, bool causal, mx::StreamOrDevice s) {
  check_decode(q, k, v, mask, causal);
  auto stream = mx::to_stream(s);
  if (stream.device != mx::Device::cpu) {
    throw std::invalid_argument("vllm_mlx sdpa_decode runs on the CPU only");
  }
  int B = q.shape(0), Hq = q.shape(1), M = q.shape(2), T = k.shape(2);
  // No copies of the cache: K and V are read through their strides (see Rows).
  std::vector<mx::array> inputs{q, k, v};
  add_mask(inputs, mask, {B, Hq, M, T}, "sdpa_decode", s);
  return mx::array({B, Hq, M, v.shape(3)}, mx::float32,
                   std::make_shared<DecodeAttention>(stream, scale, causal), inputs);
}

void DecodeAttention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) {
    encoder.set_input_array(a);
  }
  encoder.set_output_array(out);
  if (bits_ != 0) {
    eval_quantized(inputs, out);
    return;
  }
  auto qv = rows_of<float>(inputs[0], encoder), kv = rows_of<float>(inputs[1], encoder);
  auto vv = rows_of<float>(inputs[2], encoder);
  AttnProblem p{};
  set_shared(p, qv, inputs, 3, inputs[1], out, scale_, causal_);
  p.k = kv.data;
  p.v = vv.data;
  std::copy(kv.strides, kv.strides + 3, p.k_strides);
  std::copy(vv.strides, vv.strides + 3, p.v_strides);
  encoder.dispatch([p, qv, kv, vv]() {
    fill_all(qv, kv, vv);
    sdpa_decode(p);
  });
}

mx::array sdpa_prefill(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                       bool causal, const std::optional<mx::array>& mask,
                       mx::StreamOrDevice s) {
  std::ostringstream msg;
  if (q.dtype() != mx::float32 || k.dtype() != mx::float32 || v.dtype() != mx::float32) {
    msg << "q, k and v must be float32";
  } else if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4) {
    msg << "q, k and v must be 4-D (batch, heads, positions, head dim)";
  } else if (q.shape(2) < 1) {
    msg << "q must have at least one position";
  } else if (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0)) {
    msg << "q, k and v must have one batch size";
  } else if (k.shape(1) != v.shape(1) || k.shape(1) < 1 || q.shape(1) % k.shape(1) != 0) {
    msg << "k and v must have one head count that divides q's (" << q.shape(1) << ")";
  } else if (k.shape(2) != v.shape(2) || k.shape(2) < 1) {
    msg << "k and v must have one length of at least 1";
  } else if (k.shape(3) != q.shape(3) || q.shape(3) < 1 || v.shape(3) < 1) {
    msg << "k's head dim must equal q's (" << q.shape(3) << ")";
  } else if (!prefill_mask_ok(mask, q.shape(0), q.shape(2), k.shape(2))) {
    msg << "mask must be bool (1 or batch, 1, queries, keys)";
  }
  auto stream = cpu_stream(msg, "sdpa_prefill", s);
  std::vector<mx::array> inputs{q, k, v}; // read through their strides (see Rows)
  if (mask) {
    inputs.push_back(mx::contiguous(*mask, false, s));
  }
  return mx::array({q.shape(0), q.shape(1), q.shape(2), v.shape(3)}, mx::float32,
                   std::make_shared<PrefillAttention>(stream, scale, causal),
                   std::move(inputs));
}

mx::array sdpa_prefill_quantized(const mx::array& q, const std::vector<mx::array>& k,
                                 const std::vector<mx::array>& v, float scale,
                                 int group_size, int bits, bool causal,
                                 const std::optional<mx::array>& mask, mx::StreamOrDevice s) {
  std::ostringstream msg;
  check_bits(msg, group_size, bits);
  if (msg.str().empty()) {
    if (q.dtype() != mx::float32 || q.ndim() != 4 || q.shape(2) < 1) {
      msg << "q must be 4-D float32 (batch, heads, positions, head dim), at least one position";
    } else {
      check_quantized_kv(msg, q, k, v, group_size, bits);
    }
  }
  if (msg.str().empty() && !prefill_mask_ok(mask, q.shape(0), q.shape(2), k[0].shape(2))) {
    msg << "mask must be bool (1 or batch, 1, queries, keys)";
  }
  auto stream = cpu_stream(msg, "sdpa_prefill_quantized", s);
  std::vector<mx::array> inputs{q, k[0], k[1], k[2], v[0], v[1], v[2]};
  if (mask) {
    inputs.push_back(mx::contiguous(*mask, false, s));
  }
  const int Dv = v[0].shape(3) * 32 / bits;
  return mx::array({q.shape(0), q.shape(1), q.shape(2), Dv}, mx::float32,
                   std::make_shared<PrefillAttention>(stream, scale, causal, bits, group_size),
                   std::move(inputs));
}

void PrefillAttention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) {
    encoder.set_input_array(a);
  }
  encoder.set_output_array(out);
  if (bits_ != 0) {
    eval_quantized(inputs, out);
    return;
  }
  const auto &q = inputs[0], &k = inputs[1], &v = inputs[2];
  auto qv = rows_of<float>(q, encoder), kv = rows_of<float>(k, encoder);
  auto vv = rows_of<float>(v, encoder);
  PrefillProblem p{};
  set_shared(p, qv, inputs, 3, k, out, scale_, causal_);
  p.k = kv.data;
  p.v = vv.data;
  std::copy(kv.strides, kv.strides + 3, p.k_strides);
  std::copy(vv.strides, vv.strides + 3, p.v_strides);
  encoder.dispatch([p, qv, kv, vv]() {
    fill_all(qv, kv, vv);
    sdpa_prefill(p);
  });
}

void PrefillAttention::eval_quantized(const std::vector<mx::array>& inputs, mx::array& out) {
  dispatch_quantized<PrefillProblem>(stream(), inputs, out, scale_, causal_, bits_, group_size_,
                                     sdpa_prefill);
}

mx::array sdpa_decode_quantized(const mx::array& q, const std::vector<mx::array>& k,
                                const std::vector<mx::array>& v, float scale, int group_size,
                                int bits, const std::optional<mx::array>& mask, bool causal,
                                mx::StreamOrDevice s) {
  std::ostringstream msg;
  check_bits(msg, group_size, bits);
  if (msg.str().empty()) {
    if (q.dtype() != mx::float32 || q.ndim() != 4) {
      msg << "q must be 4-D float32 (batch, heads, positions, head dim)";
    } else if (q.shape(2) < 1 || q.shape(2) > kMaxDecodeQueries) {
      msg << "q must have 1 to " << kMaxDecodeQueries << " positions, not " << q.shape(2);
    } else {
      check_quantized_kv(msg, q, k, v, group_size, bits);
    }
  }
  if (!msg.str().empty()) {
    // the first problem is named
  } else if (mask && mask->dtype() != mx::bool_ && !mx::issubdtype(mask->dtype(), mx::floating)) {
    msg << "mask must be bool or floating point";
  } else if (mask && causal) {
    msg << "a mask and causal exclude each other (MLX takes one or the other)";
  }
  auto stream = cpu_stream(msg, "sdpa_decode_quantized", s);
  int B = q.shape(0), Hq = q.shape(1), M = q.shape(2), T = k[0].shape(2);
  int Dv = v[0].shape(3) * 32 / bits;
  std::vector<mx::array> inputs{q, k[0], k[1], k[2], v[0], v[1], v[2]};
  add_mask(inputs, mask, {B, Hq, M, T}, "sdpa_decode_quantized", s);
  return mx::array({B, Hq, M, Dv}, mx::float32,
                   std::make_shared<DecodeAttention>(stream, scale, causal, bits, group_size),
                   inputs);
}

void DecodeAttention::eval_quantized(const std::vector<mx::array>& inputs, mx::array& out) {
  dispatch_quantized<AttnProblem>(stream(), inputs, out, scale_, causal_, bits_, group_size_,
                                  sdpa_decode);
}

void PrefillAttention::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("VllmMlxPrefillAttention runs on the CPU only");
}

void DecodeAttention::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("VllmMlxDecodeAttention runs on the CPU only");
}

mx::array softmax_prefill(const mx::array& scores, int M, bool causal,
                          const std::optional<mx::array>& mask, mx::StreamOrDevice s) {
  std::ostringstream msg;
  if (scores.dtype() != mx::float32 || scores.ndim() != 4) {
    msg << "scores must be 4-D float32 (batch, heads, rows, keys)";
  } else if (M < 1 || scores.shape(2) % M != 0 || scores.shape(3) < 1) {
    msg << "the rows (" << scores.shape(2) << ") must be a multiple of M (" << M << ")";
  } else if (mask && (mask->dtype() != mx::bool_ || mask->ndim() != 4 || mask->shape(1) != 1 ||
                      mask->shape(2) != M || mask->shape(3) != scores.shape(3) ||
                      (mask->shape(0) != 1 && mask->shape(0) != scores.shape(0)))) {
    msg << "mask must be bool (1 or batch, 1, M, keys)";
  }
  if (!msg.str().empty()) {
    throw std::invalid_argument("vllm_mlx softmax_prefill: " + msg.str());
  }
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs{mx::contiguous(scores, false, s)};
  if (mask) {
    inputs.push_back(mx::contiguous(*mask, false, s));
  }
  return mx::array(scores.shape(), mx::float32,
                   std::make_shared<PrefillSoftmax>(stream, M, causal), std::move(inputs));
}

void PrefillSoftmax::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& scores = inputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) {
    encoder.set_input_array(a);
  }
  encoder.set_output_array(out);
  SoftmaxProblem p{};
  p.scores = scores.data<float>();
  p.s = out.data<float>();
  p.L = scores.shape(3);
  p.M = M_;
  p.rows = static_cast<int64_t>(scores.size() / p.L);
  p.causal = causal_;
  p.rows_per_batch = static_cast<int64_t>(scores.shape(1)) * scores.shape(2);
  if (inputs.size() > 1) {
    p.mask = inputs[1].data<bool>();
    p.mask_batches = inputs[1].shape(0);
  } else {
    p.mask = nullptr;
    p.mask_batches = 1;
  }
  encoder.dispatch([p]() { softmax_prefill(p); });
}

void PrefillSoftmax::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("VllmMlxPrefillSoftmax runs on the CPU only");
}

} // namespace vllm_mlx_kernels
