#include "logsumexp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "act_kernel.h"
#include "mlx/backend/cpu/encoder.h"
#include "strided.h"

namespace vllm_mlx_kernels {

namespace {

// The row's maximum and, when it is finite, exp(x - maximum) in `scratch` with MLX's exp
// (act_kernel.h), vectorised.
float shifted_exponentials(const float* x, int n, std::vector<float>& scratch) {
  float maximum = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) {
    maximum = std::max(x[i], maximum); // MLX's maximum(vals, vmaximum), vals first
  }
  if (std::isinf(maximum)) {
    return maximum;
  }
  scratch.resize(n);
  for (int i = 0; i < n; ++i) {
    scratch[i] = x[i] - maximum;
  }
  exp_inplace(scratch.data(), static_cast<size_t>(n));
  return maximum;
}

// One row: MLX's order of operations (see logsumexp.h), the sum left sequential as
// MLX's is.
float row_logsumexp(const float* x, int n, std::vector<float>& scratch) {
  const float maximum = shifted_exponentials(x, n, scratch);
  if (std::isinf(maximum)) {
    return maximum;
  }
  float normalizer = 0.0f;
  for (int i = 0; i < n; ++i) {
    normalizer = normalizer + scratch[i];
  }
  return std::log(normalizer) + maximum;
}

// The index the cumulative sum of softmax(x) first passes u (in [0, 1)) at; the sums in
// double, so a 150k-entry vocabulary loses no token to rounding.
uint32_t row_draw(const float* x, int n, float u, std::vector<float>& scratch) {
  const float maximum = shifted_exponentials(x, n, scratch);
  if (maximum == -std::numeric_limits<float>::infinity()) {
    return 0; // nothing allowed: any valid index, as Gumbel-max gives one too
  }
  if (std::isinf(maximum)) { // +inf: all the mass on the first such entry
    return static_cast<uint32_t>(std::find(x, x + n, maximum) - x);
  }
  double total = 0.0;
  for (int i = 0; i < n; ++i) {
    total += scratch[i];
  }
  const double target = static_cast<double>(u) * total;
  double running = 0.0;
  int last = -1; // the last entry with any mass: where rounding leaves the target past the end
  for (int i = 0; i < n; ++i) {
    if (scratch[i] > 0.0f) {
      running += scratch[i];
      last = i;
      if (running > target) {
        return static_cast<uint32_t>(i);
      }
    }
  }
  return static_cast<uint32_t>(last < 0 ? 0 : last); // (NaN logits: no mass anywhere)
}

} // namespace

mx::array categorical_draw(const mx::array& logits, const mx::array& uniform,
                           mx::StreamOrDevice s) {
  if (logits.dtype() != mx::float32 || logits.ndim() < 1 || logits.shape(-1) < 1 ||
      uniform.dtype() != mx::float32 || uniform.size() * logits.shape(-1) != logits.size()) {
    throw std::invalid_argument(
        "vllm_mlx categorical_draw: float32 logits [..., V] and one float32 uniform per row");
  }
  auto stream = mx::to_stream(s);
  if (stream.device != mx::Device::cpu) {
    throw std::invalid_argument("vllm_mlx categorical_draw runs on the CPU only");
  }
  auto shape = logits.shape();
  shape.pop_back();
  return mx::array(std::move(shape), mx::uint32, std::make_shared<FastCategoricalDraw>(stream),
                   {logits, mx::contiguous(uniform, false, s)});
}

void FastCategoricalDraw::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& x = inputs[0];
  auto& u = inputs[1];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(x);
  encoder.set_input_array(u);
  encoder.set_output_array(out);
  auto rows = row_major(x, encoder);
  int n = x.shape(-1);
  size_t count = x.size() / static_cast<size_t>(n);
  encoder.dispatch([rows, up = u.data<float>(), op = out.data<uint32_t>(), n, count]() {
    if (rows.fill) {
      rows.fill();
    }
    thread_local std::vector<float> scratch;
    for (size_t r = 0; r < count; ++r) {
      op[r] = row_draw(rows.data + r * static_cast<size_t>(n), n, up[r], scratch);
    }
  });
}

void FastCategoricalDraw::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("VllmMlxCategoricalDraw runs on the CPU only");
}

mx::array logsumexp(const mx::array& x, mx::StreamOrDevice s) {
  if (x.dtype() != mx::float32 || x.ndim() < 1 || x.shape(-1) < 1) {
    throw std::invalid_argument("vllm_mlx logsumexp: x must be float32 with a last axis");
  }
  auto stream = mx::to_stream(s);
  if (stream.device != mx::Device::cpu) {
    throw std::invalid_argument("vllm_mlx logsumexp runs on the CPU only");
  }
  auto shape = x.shape();
  shape.back() = 1;
  return mx::array(std::move(shape), mx::float32, std::make_shared<FastLogSumExp>(stream), {x});
}

void FastLogSumExp::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& x = inputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(x);
  encoder.set_output_array(out);
  auto rows = row_major(x, encoder); // a strided x is copied
  int n = x.shape(-1);
  size_t count = x.size() / static_cast<size_t>(n);
  encoder.dispatch([rows, op = out.data<float>(), n, count]() {
    if (rows.fill) {
      rows.fill();
    }
    thread_local std::vector<float> scratch;
    for (size_t r = 0; r < count; ++r) {
      op[r] = row_logsumexp(rows.data + r * static_cast<size_t>(n), n, scratch);
    }
  });
}

void FastLogSumExp::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("VllmMlxLogSumExp runs on the CPU only");
}

} // namespace vllm_mlx_kernels
