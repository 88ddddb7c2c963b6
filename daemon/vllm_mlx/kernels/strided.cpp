#include "strided.h"

#include "mlx/allocator.h"

namespace vllm_mlx_kernels {

RowMajor row_major(const mx::array& x, mx::cpu::CommandEncoder& encoder) {
  if (x.flags().row_contiguous) {
    return {x.data<float>(), {}};
  }
  auto packed = mx::array(x.shape(), mx::float32, nullptr, {});
  packed.set_data(mx::allocator::malloc(packed.nbytes()));
  encoder.add_temporary(packed);
  float* dst = packed.data<float>();
  return {dst, [src = x.data<float>(), shape = x.shape(), strides = x.strides(), dst]() {
            gather_strided(src, shape, strides, dst);
          }};
}

} // namespace vllm_mlx_kernels
