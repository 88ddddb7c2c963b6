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

// One row: MLX's order of operations (see logsumexp.h), the exponentials vectorised into
// a scratch buffer, the sum left sequential as MLX's is.
float row_logsumexp(const float* x, int n, std::vector<float>& scratch) {
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
  float normalizer = 0.0f;
  for (int i = 0; i < n; ++i) {
    normalizer = normalizer + scratch[i];
  }
  return std::log(normalizer) + maximum;
}

} // namespace

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
