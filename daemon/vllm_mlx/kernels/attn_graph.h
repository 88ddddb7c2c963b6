// What the attention ops' graph side shares (attn.cpp, attn_append.cpp): argument
// checks, the mask as an input, reading 4-D inputs through their strides, and the
// fields every decode problem has.
#pragma once

#include <algorithm>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn.h"
#include "attn_kernel.h"
#include "mlx/backend/cpu/encoder.h"
#include "strided.h"

namespace vllm_mlx_kernels::attn_graph {

inline void check_decode(const mx::array& q, const mx::array& k, const mx::array& v,
           const std::optional<mx::array>& mask, bool causal) {
  std::ostringstream msg;
  if (q.dtype() != mx::float32 || k.dtype() != mx::float32 || v.dtype() != mx::float32) {
    msg << "q, k and v must be float32";
  } else if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4) {
    msg << "q, k and v must be 4-D (batch, heads, positions, head dim)";
  } else if (q.shape(2) < 1 || q.shape(2) > kMaxDecodeQueries) {
    msg << "q must have 1 to " << kMaxDecodeQueries << " positions, not " << q.shape(2)
        << " (sdpa_prefill takes more)";
  } else if (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0)) {
    msg << "q, k and v must have one batch size";
  } else if (k.shape(1) != v.shape(1) || k.shape(1) < 1 || q.shape(1) % k.shape(1) != 0) {
    msg << "k and v must have one head count that divides q's (" << q.shape(1) << ")";
  } else if (k.shape(2) != v.shape(2) || k.shape(2) < 1) {
    msg << "k and v must have one length of at least 1";
  } else if (k.shape(3) != q.shape(3) || q.shape(3) < 1 || v.shape(3) < 1) {
    msg << "k's head dim must equal q's (" << q.shape(3) << ")";
  } else if (mask && mask->dtype() != mx::bool_ && !mx::issubdtype(mask->dtype(), mx::floating)) {
    msg << "mask must be bool or floating point";
  } else if (mask && causal) {
    msg << "a mask and causal exclude each other (MLX takes one or the other)";
  } else {
    return;
  }
  throw std::invalid_argument("vllm_mlx sdpa_decode: " + msg.str());
}

// The mask broadcast to (B, Hq, M, T) (zero strides, no copy), bool or as float32.
inline void add_mask(std::vector<mx::array>& inputs, const std::optional<mx::array>& mask,
              const mx::Shape& shape, const char* op, mx::StreamOrDevice s) {
  if (!mask) {
    return;
  }
  auto m = mask->dtype() == mx::bool_ ? *mask : mx::astype(*mask, mx::float32, s);
  try {
    inputs.push_back(mx::broadcast_to(m, shape, s));
  } catch (const std::invalid_argument&) {
    std::ostringstream msg;
    msg << "vllm_mlx " << op << ": the mask must broadcast to (" << shape[0] << ", " << shape[1]
        << ", " << shape[2] << ", " << shape[3] << ")";
    throw std::invalid_argument(msg.str());
  }
}

// A 4-D array's rows as the kernel reads them: in place when the last dimension is
// contiguous (the cache slices always are), else a packed copy that `fill` makes in the
// task (the input's contents exist only then).
template <typename T>
struct Rows {
  const T* data;
  int64_t strides[3];
  std::function<void()> fill; // empty when read in place
};

template <typename T>
Rows<T> rows_of(const mx::array& a, mx::cpu::CommandEncoder& encoder) {
  const auto& st = a.strides();
  if (st[3] == 1 || a.shape(3) == 1) {
    return {a.data<T>(), {st[0], st[1], st[2]}, {}};
  }
  auto packed = mx::array(a.shape(), a.dtype(), nullptr, {});
  packed.set_data(mx::allocator::malloc(packed.nbytes()));
  encoder.add_temporary(packed);
  T* dst = packed.data<T>();
  int64_t inner = a.shape(3);
  return {dst,
          {a.shape(1) * a.shape(2) * inner, a.shape(2) * inner, inner},
          [src = a.data<T>(), shape = a.shape(), strides = a.strides(), dst]() {
            gather_strided(src, shape, strides, dst);
          }};
}

// Strided inputs (never the cache's) are packed in the task, once their contents exist.
template <typename... Ts>
void fill_all(const Rows<Ts>&... rows) {
  for (const auto* fill : {&rows.fill...}) {
    if (*fill) {
      (*fill)();
    }
  }
}

// What the float and quantized decode problems share: q, the mask (inputs[mask_at], if
// there), the causal flag, the output and the sizes; K's heads and positions from `kv`
// (K itself, or its packed words).
inline void set_shared(AttnProblem& p, const Rows<float>& qv, const std::vector<mx::array>& inputs,
                size_t mask_at, const mx::array& kv, mx::array& out, float scale, bool causal) {
  const auto& q = inputs[0];
  p.q = qv.data;
  std::copy(qv.strides, qv.strides + 3, p.q_strides);
  p.mask_kind = MaskKind::none;
  if (inputs.size() > mask_at) {
    const auto& m = inputs[mask_at]; // (B, Hq, M, T), broadcast: zero strides
    p.mask = m.data<void>();
    std::copy(m.strides().begin(), m.strides().end(), p.mask_strides);
    p.mask_kind = m.dtype() == mx::bool_ ? MaskKind::boolean : MaskKind::additive;
  }
  p.causal = causal;
  p.out = out.data<float>();
  p.B = q.shape(0);
  p.Hq = q.shape(1);
  p.Hkv = kv.shape(1);
  p.M = q.shape(2);
  p.T = kv.shape(2);
  p.D = q.shape(3);
  p.Dv = out.shape(3);
  p.scale = scale;
}

} // namespace vllm_mlx_kernels::attn_graph
