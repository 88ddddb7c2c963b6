#include "strided.h"

#include <stdexcept>
#include <string>

#include "mlx/allocator.h"

namespace vllm_mlx_kernels {

mx::Stream cpu_stream(mx::StreamOrDevice s, const char* op) {
  auto stream = mx::to_stream(s);
  if (stream.device != mx::Device::cpu) {
    throw std::invalid_argument(std::string("vllm_mlx ") + op + " runs on the CPU only");
  }
  return stream;
}

float* temporary_floats(size_t count, mx::cpu::CommandEncoder& encoder) {
  auto buffer = mx::array({static_cast<int>(count)}, mx::float32, nullptr, {});
  buffer.set_data(mx::allocator::malloc(buffer.nbytes()));
  encoder.add_temporary(buffer);
  return buffer.data<float>();
}

RowMajor row_major(const mx::array& x, mx::cpu::CommandEncoder& encoder) {
  if (x.flags().row_contiguous) {
    return {x.data<float>(), {}};
  }
  float* dst = temporary_floats(x.size(), encoder);
  return {dst, [src = x.data<float>(), shape = x.shape(), strides = x.strides(), dst]() {
            gather_strided(src, shape, strides, dst);
          }};
}

} // namespace vllm_mlx_kernels
