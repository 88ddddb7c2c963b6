// sdpa_decode_append: a decode step's cache update and attention in one node (attn.h).
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "attn.h"
#include "attn_graph.h"
#include "attn_kernel.h"
#include "mlx/backend/cpu/encoder.h"
#include "strided.h"

namespace vllm_mlx_kernels {

using namespace attn_graph;

namespace {

void check_append(const mx::array& q, const mx::array& k, const mx::array& v,
                  const mx::array& k_cache, const mx::array& v_cache, int position) {
  std::ostringstream msg;
  if (k_cache.dtype() != mx::float32 || v_cache.dtype() != mx::float32 ||
      k_cache.ndim() != 4 || v_cache.ndim() != 4) {
    msg << "k_cache and v_cache must be 4-D float32 (batch, heads, positions, head dim)";
  } else if (q.ndim() != 4 || q.shape(2) != 1 || k.ndim() != 4 || k.shape(2) != 1 ||
             v.ndim() != 4 || v.shape(2) != 1) {
    msg << "q, k and v must be 4-D with one position";
  } else if (k_cache.shape(0) != k.shape(0) || k_cache.shape(1) != k.shape(1) ||
             k_cache.shape(3) != k.shape(3) || v_cache.shape(0) != v.shape(0) ||
             v_cache.shape(1) != v.shape(1) || v_cache.shape(3) != v.shape(3) ||
             k_cache.shape(2) != v_cache.shape(2)) {
    msg << "k_cache and v_cache must hold k's and v's (batch, heads, head dim) over one "
        << "length";
  } else if (position < 0 || position >= k_cache.shape(2)) {
    msg << "position must be in [0, " << k_cache.shape(2) << "), not " << position;
  }
  if (!msg.str().empty()) {
    throw std::invalid_argument("vllm_mlx sdpa_decode_append: " + msg.str());
  }
}

// The new cache buffer `next` for `cache`: cache's own buffer when nothing else holds it
// (MLX's donation, as its slice update does), else a copy that `fill` makes in the task.
std::function<void()> take_or_copy(const mx::array& cache, mx::array& next) {
  if (cache.flags().row_contiguous && cache.is_donatable()) {
    next.copy_shared_buffer(cache);
    return {};
  }
  next.set_data(mx::allocator::malloc(next.nbytes()));
  return [src = cache.data<float>(), shape = cache.shape(), strides = cache.strides(),
          contiguous = cache.flags().row_contiguous, dst = next.data<float>(),
          bytes = next.nbytes()]() {
    if (contiguous) {
      std::memcpy(dst, src, bytes);
    } else {
      gather_strided(src, shape, strides, dst);
    }
  };
}

// Row (b, h) of a (B, H, 1, D) input into position `position` of a row-major (B, H, S, D)
// cache.
void write_position(const Rows<float>& rows, float* cache, int B, int H, int S, int D,
                    int position) {
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const float* src = rows.data + b * rows.strides[0] + h * rows.strides[1];
      float* dst = cache + ((static_cast<int64_t>(b) * H + h) * S + position) * D;
      std::memcpy(dst, src, sizeof(float) * D);
    }
  }
}

} // namespace

std::vector<mx::array> sdpa_decode_append(const mx::array& q, const mx::array& k,
                                          const mx::array& v, const mx::array& k_cache,
                                          const mx::array& v_cache, int position, float scale,
                                          const std::optional<mx::array>& mask,
                                          mx::StreamOrDevice s) {
  check_decode(q, k, v, mask, false);
  check_append(q, k, v, k_cache, v_cache, position);
  auto stream = cpu_stream(s, "sdpa_decode_append");
  int B = q.shape(0), Hq = q.shape(1);
  std::vector<mx::array> inputs{q, k, v, k_cache, v_cache};
  add_mask(inputs, mask, {B, Hq, 1, position + 1}, "sdpa_decode_append", s);
  return mx::array::make_arrays({{B, Hq, 1, v.shape(3)}, k_cache.shape(), v_cache.shape()},
                                {mx::float32, mx::float32, mx::float32},
                                std::make_shared<DecodeAppendAttention>(stream, position, scale),
                                std::move(inputs));
}

void DecodeAppendAttention::eval_cpu(const std::vector<mx::array>& inputs,
                                     std::vector<mx::array>& outputs) {
  auto& encoder = mx::cpu::get_command_encoder(stream());
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  // Every output of a node holds its own copy of the inputs (mx::array::make_arrays), so
  // the caches are never donatable while the two siblings keep theirs. They drop them
  // here, as MLX's detach() does right after this call; `inputs` is the evaluated
  // array's own list, which stays. (An MLX that passes a copy instead only costs a
  // copy of the caches below.)
  for (auto& o : outputs) {
    if (&o.inputs() != &inputs) {
      o.inputs().clear();
    }
  }
  auto copy_k = take_or_copy(inputs[3], outputs[1]);
  auto copy_v = take_or_copy(inputs[4], outputs[2]);
  for (auto& a : inputs) {
    encoder.set_input_array(a);
  }
  for (auto& o : outputs) {
    encoder.set_output_array(o);
  }
  auto qv = rows_of<float>(inputs[0], encoder);
  auto kv = rows_of<float>(inputs[1], encoder), vv = rows_of<float>(inputs[2], encoder);
  auto& k_cache = outputs[1];
  auto& v_cache = outputs[2];
  int B = k_cache.shape(0), Hkv = k_cache.shape(1), S = k_cache.shape(2);
  int D = k_cache.shape(3), Dv = v_cache.shape(3);
  // The attention reads the caches as sdpa_decode reads mlx_lm's slice of them: the
  // first position + 1 positions, through the whole buffer's strides.
  AttnProblem p{};
  set_shared(p, qv, inputs, 5, inputs[1], out, scale_, false);
  p.T = position_ + 1;
  p.k = k_cache.data<float>();
  p.v = v_cache.data<float>();
  int64_t k_strides[3] = {static_cast<int64_t>(Hkv) * S * D, static_cast<int64_t>(S) * D, D};
  int64_t v_strides[3] = {static_cast<int64_t>(Hkv) * S * Dv, static_cast<int64_t>(S) * Dv, Dv};
  std::copy(k_strides, k_strides + 3, p.k_strides);
  std::copy(v_strides, v_strides + 3, p.v_strides);
  float* k_out = k_cache.data<float>();
  float* v_out = v_cache.data<float>();
  encoder.dispatch([p, qv, kv, vv, copy_k, copy_v, k_out, v_out, B, Hkv, S, D, Dv,
                    position = position_]() {
    fill_all(qv, kv, vv);
    for (const auto* copy : {&copy_k, &copy_v}) {
      if (*copy) {
        (*copy)();
      }
    }
    write_position(kv, k_out, B, Hkv, S, D, position);
    write_position(vv, v_out, B, Hkv, S, Dv, position);
    sdpa_decode(p);
  });
}

void DecodeAppendAttention::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("VllmMlxDecodeAppendAttention runs on the CPU only");
}

} // namespace vllm_mlx_kernels
