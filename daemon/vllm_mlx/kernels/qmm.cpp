#include "qmm.h"

#include <sstream>
#include <stdexcept>

#include "dequant.h"
#include "mlx/backend/cpu/encoder.h"
#include "qmm_kernel.h"
#include "strided.h"

namespace vllm_mlx_kernels {

void check_weights(int K, const mx::array& w, const mx::array& scales, const mx::array& biases,
                   int group_size, int bits, const char* op) {
  std::ostringstream msg;
  if (!supported(bits, group_size)) {
    msg << "bits " << bits << " with group size " << group_size << " has no kernel";
  } else if (w.dtype() != mx::uint32 || w.ndim() != 2) {
    msg << "w must be a 2-D uint32 array of packed weights";
  } else if (K != w.shape(1) * 32 / bits) {
    msg << "x's last dimension must be " << w.shape(1) * 32 / bits;
  } else if (scales.ndim() != 2 || scales.shape(0) != w.shape(0) ||
             scales.shape(1) * group_size != K || biases.shape() != scales.shape() ||
             biases.dtype() != scales.dtype()) {
    msg << "scales and biases must both be [" << w.shape(0) << ", " << K / group_size
        << "] of one dtype";
  } else if (scales.dtype() != mx::float32 && scales.dtype() != mx::float16 &&
             scales.dtype() != mx::bfloat16) {
    msg << "scales must be float32, float16 or bfloat16";
  } else {
    return;
  }
  throw std::invalid_argument(std::string("vllm_mlx ") + op + ": " + msg.str());
}

ScaleType scale_type(mx::Dtype t) {
  if (t == mx::float16) {
    return ScaleType::f16;
  }
  return t == mx::bfloat16 ? ScaleType::bf16 : ScaleType::f32;
}

namespace {

void check(const mx::array& x, const mx::array& w, const mx::array& scales,
           const mx::array& biases, int group_size, int bits) {
  if (x.ndim() < 1) {
    throw std::invalid_argument("vllm_mlx quantized_matmul: x must have a last dimension");
  }
  check_weights(x.shape(-1), w, scales, biases, group_size, bits, "quantized_matmul");
  if (!mx::issubdtype(x.dtype(), mx::floating)) {
    throw std::invalid_argument("vllm_mlx quantized_matmul: x must be floating point");
  }
}

} // namespace

mx::array quantized_matmul(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    int group_size,
    int bits,
    int max_rows,
    bool int8,
    mx::StreamOrDevice s) {
  check(x, w, scales, biases, group_size, bits);
  auto out_dtype = mx::promote_types(x.dtype(), scales.dtype());
  int K = x.shape(-1);
  int N = w.shape(0);
  int M = static_cast<int>(x.size() / K);
  auto stream = mx::to_stream(s);
  // A decode step makes ~200 of these calls, and each extra graph node costs a few
  // microseconds on the CPU: weights already evaluated and row-contiguous (every loaded
  // model's) go in as they are, and the node takes x in any shape and layout (eval_cpu
  // reads a strided x through a copy), so the call adds one node, not seven.
  auto as_is = [&](const mx::array& a) {
    return a.is_available() && a.flags().row_contiguous ? a : mx::contiguous(a, false, s);
  };
  if (stream.device != mx::Device::cpu) {
    auto wf = mx::dequantize(w, scales, biases, group_size, bits, "affine",
                             std::nullopt, out_dtype, s);
    return mx::matmul(mx::astype(x, out_dtype, s), mx::transpose(wf, s), s);
  }
  if (M > max_rows) {
    // Prefill: unpacking weights once per call and handing the product to BLAS beats
    // re-unpacking them for every few rows. The unpacking is ours (threaded), not MLX's
    // single-threaded loop: the same floats, ~1.8 s less per 512-row chunk of the
    // bundled model (docs/benchmarks.md).
    auto wf = mx::array(
        {N, K}, mx::float32, std::make_shared<FastDequantize>(stream, group_size, bits),
        {as_is(w), as_is(scales), as_is(biases)});
    return mx::matmul(mx::astype(x, out_dtype, s), mx::transpose(mx::astype(wf, out_dtype, s), s), s);
  }
  auto shape = x.shape();
  shape.back() = N;
  auto inputs = std::vector<mx::array>{
      mx::astype(x, mx::float32, s), as_is(w), as_is(scales), as_is(biases)};
  auto y = mx::array(
      std::move(shape), mx::float32,
      std::make_shared<FastQuantizedMatmul>(stream, group_size, bits, int8), std::move(inputs));
  return mx::astype(y, out_dtype, s);
}

std::vector<mx::array> quantized_matmul_many(
    const mx::array& x,
    const std::vector<mx::array>& ws,
    const std::vector<mx::array>& scales,
    const std::vector<mx::array>& biases,
    int group_size,
    int bits,
    int max_rows,
    bool int8,
    mx::StreamOrDevice s) {
  if (ws.empty() || scales.size() != ws.size() || biases.size() != ws.size()) {
    throw std::invalid_argument(
        "vllm_mlx quantized_matmul_many: one or more weight sets, each with its scales and "
        "biases");
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    check(x, ws[i], scales[i], biases[i], group_size, bits);
    if (scales[i].dtype() != scales[0].dtype()) {
      throw std::invalid_argument(
          "vllm_mlx quantized_matmul_many: every set's scales must have one dtype");
    }
  }
  auto stream = mx::to_stream(s);
  int K = x.shape(-1);
  int M = static_cast<int>(x.size() / K);
  if (stream.device != mx::Device::cpu || M > max_rows || ws.size() == 1) {
    std::vector<mx::array> outs;
    for (size_t i = 0; i < ws.size(); ++i) {
      outs.push_back(
          quantized_matmul(x, ws[i], scales[i], biases[i], group_size, bits, max_rows, int8, s));
    }
    return outs;
  }
  auto as_is = [&](const mx::array& a) {
    return a.is_available() && a.flags().row_contiguous ? a : mx::contiguous(a, false, s);
  };
  std::vector<mx::array> inputs{mx::astype(x, mx::float32, s)};
  std::vector<mx::Shape> shapes;
  for (size_t i = 0; i < ws.size(); ++i) {
    inputs.push_back(as_is(ws[i]));
    inputs.push_back(as_is(scales[i]));
    inputs.push_back(as_is(biases[i]));
    auto shape = x.shape();
    shape.back() = ws[i].shape(0);
    shapes.push_back(std::move(shape));
  }
  std::vector<mx::Dtype> dtypes(ws.size(), mx::float32);
  auto ys = mx::array::make_arrays(
      std::move(shapes), dtypes,
      std::make_shared<FastQuantizedMatmulMany>(stream, group_size, bits, int8),
      std::move(inputs));
  auto out_dtype = mx::promote_types(x.dtype(), scales[0].dtype());
  for (auto& y : ys) {
    y = mx::astype(y, out_dtype, s);
  }
  return ys;
}

mx::array dequantize(
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    int group_size,
    int bits,
    mx::StreamOrDevice s) {
  int K = w.ndim() == 2 ? w.shape(1) * 32 / bits : 0;
  check(mx::zeros({1, K}, mx::float32, s), w, scales, biases, group_size, bits);
  auto stream = mx::to_stream(s);
  return mx::array(
      {w.shape(0), K}, mx::float32, std::make_shared<FastDequantize>(stream, group_size, bits),
      {mx::contiguous(w, false, s), mx::contiguous(scales, false, s),
       mx::contiguous(biases, false, s)});
}

void FastDequantize::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& w = inputs[0];
  auto& scales = inputs[1];
  auto& biases = inputs[2];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) {
    encoder.set_input_array(a);
  }
  encoder.set_output_array(out);
  QmmProblem p{
      nullptr, w.data<uint32_t>(), scales.data<void>(), biases.data<void>(), nullptr, 0,
      w.shape(0), w.shape(1) * 32 / bits_, group_size_, bits_, scale_type(scales.dtype())};
  encoder.dispatch([p, dst = out.data<float>()]() { dequantize_weights(p, dst); });
}

void FastDequantize::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("VllmMlxDequantize runs on the CPU only");
}

bool FastDequantize::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const FastDequantize&>(other);
  return group_size_ == o.group_size_ && bits_ == o.bits_;
}

void FastQuantizedMatmul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& x = inputs[0];
  auto& w = inputs[1];
  auto& scales = inputs[2];
  auto& biases = inputs[3];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) {
    encoder.set_input_array(a);
  }
  encoder.set_output_array(out);
  int K = w.shape(1) * 32 / bits_;
  int M = K == 0 ? 0 : static_cast<int>(x.size() / K);
  QmmProblem p{
      x.data<float>(), w.data<uint32_t>(), scales.data<void>(), biases.data<void>(),
      out.data<float>(), M, w.shape(0), K, group_size_, bits_, scale_type(scales.dtype()),
      int8_};
  auto rows = row_major(x, encoder); // a strided x (rare: a transposed view) is copied
  p.x = rows.data;
  encoder.dispatch([p, fill = std::move(rows.fill)]() {
    if (fill) {
      fill();
    }
    qmm(p);
  });
}

void FastQuantizedMatmul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("VllmMlxQuantizedMatmul runs on the CPU only");
}

bool FastQuantizedMatmul::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const FastQuantizedMatmul&>(other);
  return group_size_ == o.group_size_ && bits_ == o.bits_ && int8_ == o.int8_;
}

void FastQuantizedMatmulMany::eval_cpu(
    const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& x = inputs[0];
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) {
    encoder.set_input_array(a);
  }
  for (auto& out : outputs) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    encoder.set_output_array(out);
  }
  int K = inputs[1].shape(1) * 32 / bits_;
  int M = K == 0 ? 0 : static_cast<int>(x.size() / K);
  auto rows = row_major(x, encoder); // a strided x (rare: a transposed view) is copied
  std::vector<QmmProblem> problems;
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto& w = inputs[1 + 3 * i];
    auto& scales = inputs[2 + 3 * i];
    auto& biases = inputs[3 + 3 * i];
    problems.push_back(QmmProblem{
        rows.data, w.data<uint32_t>(), scales.data<void>(), biases.data<void>(),
        outputs[i].data<float>(), M, w.shape(0), K, group_size_, bits_,
        scale_type(scales.dtype()), int8_});
  }
  encoder.dispatch([problems = std::move(problems), fill = std::move(rows.fill)]() {
    if (fill) {
      fill();
    }
    qmm_many(problems.data(), static_cast<int>(problems.size()));
  });
}

void FastQuantizedMatmulMany::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("VllmMlxQuantizedMatmulMany runs on the CPU only");
}

bool FastQuantizedMatmulMany::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const FastQuantizedMatmulMany&>(other);
  return group_size_ == o.group_size_ && bits_ == o.bits_ && int8_ == o.int8_;
}

} // namespace vllm_mlx_kernels
