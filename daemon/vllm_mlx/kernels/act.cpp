#include "act.h"

#include <stdexcept>

#include "act_kernel.h"
#include "mlx/backend/cpu/encoder.h"

namespace vllm_mlx_kernels {

mx::array swiglu(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s) {
  if (gate.dtype() != mx::float32 || up.dtype() != mx::float32 || gate.shape() != up.shape()) {
    throw std::invalid_argument("vllm_mlx swiglu: gate and up must be float32 of one shape");
  }
  auto stream = mx::to_stream(s);
  if (stream.device != mx::Device::cpu) {
    throw std::invalid_argument("vllm_mlx swiglu runs on the CPU only");
  }
  auto inputs = std::vector<mx::array>{
      mx::contiguous(gate, false, s), mx::contiguous(up, false, s)};
  return mx::array(gate.shape(), mx::float32, std::make_shared<FastSwiglu>(stream), inputs);
}

void FastSwiglu::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& g = inputs[0];
  auto& u = inputs[1];
  // Elementwise: the output may take over an input's buffer when nothing else holds it.
  if (g.is_donatable()) {
    out.copy_shared_buffer(g);
  } else if (u.is_donatable()) {
    out.copy_shared_buffer(u);
  } else {
    out.set_data(mx::allocator::malloc(out.nbytes()));
  }
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(g);
  encoder.set_input_array(u);
  encoder.set_output_array(out);
  encoder.dispatch([gp = g.data<float>(), up = u.data<float>(), op = out.data<float>(),
                    n = out.size()]() { swiglu(gp, up, op, n); });
}

void FastSwiglu::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("VllmMlxSwiglu runs on the CPU only");
}

} // namespace vllm_mlx_kernels
