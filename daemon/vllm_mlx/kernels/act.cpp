#include "act.h"

#include <stdexcept>

#include "act_kernel.h"
#include "strided.h"
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
  // Any layout: eval_cpu copies a strided input (see strided.h) instead of a contiguous node.
  return mx::array(gate.shape(), mx::float32, std::make_shared<FastSwiglu>(stream), {gate, up});
}

void FastSwiglu::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& g = inputs[0];
  auto& u = inputs[1];
  // Elementwise: the output may take over a row-contiguous input's buffer when nothing
  // else holds it.
  if (g.is_donatable() && g.flags().row_contiguous) {
    out.copy_shared_buffer(g);
  } else if (u.is_donatable() && u.flags().row_contiguous) {
    out.copy_shared_buffer(u);
  } else {
    out.set_data(mx::allocator::malloc(out.nbytes()));
  }
  auto& encoder = mx::cpu::get_command_encoder(stream());
  encoder.set_input_array(g);
  encoder.set_input_array(u);
  encoder.set_output_array(out);
  auto gr = row_major(g, encoder);
  auto ur = row_major(u, encoder);
  encoder.dispatch([gr, ur, op = out.data<float>(), n = out.size()]() {
    for (auto* in : {&gr, &ur}) {
      if (in->fill) {
        in->fill();
      }
    }
    swiglu(gr.data, ur.data, op, n);
  });
}

void FastSwiglu::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("VllmMlxSwiglu runs on the CPU only");
}

} // namespace vllm_mlx_kernels
