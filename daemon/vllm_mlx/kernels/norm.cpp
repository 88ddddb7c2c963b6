#include "norm.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/backend/cpu/simd/simd.h"
#include "norm_kernel.h"
#include "strided.h"

namespace vllm_mlx_kernels {

namespace {

// MLX's own CPU exp, sin and cos (header templates, one float at a time, as its fallback
// graph evaluates them), so the rotation angles carry the same bits.
float mlx_exp(float v) {
  return mx::simd::exp(mx::simd::Simd<float, 1>(v)).value;
}
float mlx_sin(float v) {
  return mx::simd::sin(mx::simd::Simd<float, 1>(v)).value;
}
float mlx_cos(float v) {
  return mx::simd::cos(mx::simd::Simd<float, 1>(v)).value;
}

RopeShape rope_shape(const mx::array& x) {
  auto& sh = x.shape();
  auto& st = x.strides();
  if (x.ndim() == 3) {
    return {sh[0], 1, sh[1], sh[2], st[0], 0, st[1], st[2]};
  }
  return {sh[0], sh[1], sh[2], sh[3], st[0], st[1], st[2], st[3]};
}

} // namespace

// One row, in the order of MLX's fallback graph on the CPU: square, a running float sum
// (the Linux wheel's reduction is one float at a time), times 1 / n (mean), + eps,
// 1 / sqrt, x * that, * weight: bit-identical to mx.fast.rms_norm there. A row gets the
// same bits whatever batch it is in.
void rms_norm_row(const float* x, const float* w, float* out, int n, float eps) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    float square = x[i] * x[i];
    sum += square;
  }
  float r = 1.0f / std::sqrt(sum * (1.0f / static_cast<float>(n)) + eps);
  for (int i = 0; i < n; ++i) {
    out[i] = (x[i] * r) * w[i];
  }
}

void RopeTask::operator()() const {
  int half = dims / 2;
  std::vector<float> inv(half), cos_t(half), sin_t(half);
  float step = std::log(base) / static_cast<float>(half);
  for (int i = 0; i < half; ++i) {
    inv[i] = freqs ? 1.0f / freqs[i] : mlx_exp(static_cast<float>(-i) * step);
  }
  for (int b = 0; b < s.B; ++b) {
    auto first = static_cast<float>(offset[b * offset_stride]);
    for (int l = 0; l < s.L; ++l) {
      float position = (static_cast<float>(l) + first) * scale;
      for (int i = 0; i < half; ++i) {
        float theta = position * inv[i];
        cos_t[i] = mlx_cos(theta);
        sin_t[i] = mlx_sin(theta);
      }
      for (int h = 0; h < s.H; ++h) {
        const float* row = x + b * s.sB + h * s.sH + l * s.sL;
        float* o = out + ((static_cast<int64_t>(b) * s.H + h) * s.L + l) * s.D;
        rotate(row, o, cos_t.data(), sin_t.data(), half);
      }
    }
  }
}

void RopeTask::rotate(const float* row, float* o, const float* c, const float* sn,
                      int half) const {
  // As MLX's fallback: (x1 * cos - x2 * sin, x1 * sin + x2 * cos), features past dims as is.
  int64_t d = s.sD;
  for (int i = 0; i < half; ++i) {
    int a = traditional ? 2 * i : i;
    int b = traditional ? 2 * i + 1 : half + i;
    float x1 = row[a * d], x2 = row[b * d];
    o[a] = x1 * c[i] - x2 * sn[i];
    o[b] = x1 * sn[i] + x2 * c[i];
  }
  for (int i = dims; i < s.D; ++i) {
    o[i] = row[i * d];
  }
}

mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps,
                   mx::StreamOrDevice s) {
  if (x.dtype() != mx::float32 || weight.dtype() != mx::float32 || x.ndim() < 1 ||
      weight.ndim() != 1 || weight.shape(0) != x.shape(-1)) {
    throw std::invalid_argument(
        "vllm_mlx rms_norm: x must be float32 and weight a float32 vector of x's last size");
  }
  if (!(eps > 0.0f)) {
    throw std::invalid_argument("vllm_mlx rms_norm: eps must be positive");
  }
  auto stream = cpu_stream(s, "rms_norm");
  return mx::array(x.shape(), mx::float32, std::make_shared<FastRmsNorm>(stream, eps),
                   {x, weight});
}

void FastRmsNorm::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& x = inputs[0];
  auto& w = inputs[1];
  if (x.is_donatable() && x.flags().row_contiguous) {
    out.copy_shared_buffer(x); // each row is read whole before it is written
  } else {
    out.set_data(mx::allocator::malloc(out.nbytes()));
  }
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(x);
  encoder.set_input_array(w);
  encoder.set_output_array(out);
  auto xr = row_major(x, encoder);
  auto wr = row_major(w, encoder);
  int n = x.shape(-1);
  size_t rows = n == 0 ? 0 : x.size() / n;
  encoder.dispatch([xr, wr, o = out.data<float>(), n, rows, eps = eps_]() {
    for (auto* in : {&xr, &wr}) {
      if (in->fill) {
        in->fill();
      }
    }
    for (size_t r = 0; r < rows; ++r) {
      rms_norm_row(xr.data + r * n, wr.data, o + r * n, n, eps);
    }
  });
}

void FastRmsNorm::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("VllmMlxRmsNorm runs on the CPU only");
}

mx::array rope(const mx::array& x, int dims, bool traditional, std::optional<float> base,
               float scale, const mx::array& offset, const std::optional<mx::array>& freqs,
               mx::StreamOrDevice s) {
  std::ostringstream msg;
  if (x.dtype() != mx::float32 || (x.ndim() != 3 && x.ndim() != 4)) {
    msg << "x must be float32 of rank 3 or 4";
  } else if (dims <= 0 || dims % 2 != 0 || dims > x.shape(-1)) {
    msg << "dims must be even, positive and at most " << x.shape(-1);
  } else if (!mx::issubdtype(offset.dtype(), mx::integer) || offset.ndim() > 1 ||
             (offset.size() != 1 && offset.size() != static_cast<size_t>(x.shape(0)))) {
    msg << "offset must be an integer or one integer per batch row (" << x.shape(0) << ")";
  } else if (base.has_value() == freqs.has_value()) {
    msg << "exactly one of base and freqs must be given";
  } else if (freqs && (freqs->ndim() != 1 || freqs->shape(0) != dims / 2)) {
    msg << "freqs must be a vector of dims / 2 = " << dims / 2 << " values";
  }
  if (!msg.str().empty()) {
    throw std::invalid_argument("vllm_mlx rope: " + msg.str());
  }
  auto stream = cpu_stream(s, "rope");
  std::vector<mx::array> inputs{x, mx::astype(offset, mx::int32, s)};
  if (freqs) {
    inputs.push_back(mx::astype(*freqs, mx::float32, s));
  }
  auto primitive = std::make_shared<FastRope>(stream, dims, traditional, base.value_or(1.0f), scale);
  return mx::array(x.shape(), mx::float32, std::move(primitive), std::move(inputs));
}

void FastRope::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& x = inputs[0];
  auto& offset = inputs[1];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) {
    encoder.set_input_array(a);
  }
  encoder.set_output_array(out);
  auto freqs = inputs.size() > 2 ? row_major(inputs[2], encoder) : RowMajor{nullptr, {}};
  RopeTask task{rope_shape(x), x.data<float>(), out.data<float>(), offset.data<int32_t>(),
                offset.size() == 1 ? 0 : offset.strides()[0], freqs.data, dims_,
                traditional_, base_, scale_};
  encoder.dispatch([task, fill = std::move(freqs.fill)]() {
    if (fill) {
      fill();
    }
    task();
  });
}

void FastRope::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("VllmMlxRope runs on the CPU only");
}

bool FastRope::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const FastRope&>(other);
  return dims_ == o.dims_ && traditional_ == o.traditional_ && base_ == o.base_ &&
         scale_ == o.scale_;
}

} // namespace vllm_mlx_kernels
