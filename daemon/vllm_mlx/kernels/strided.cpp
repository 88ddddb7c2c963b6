#include "strided.h"

#include <vector>

#include "mlx/allocator.h"

namespace vllm_mlx_kernels {

void gather_strided(const float* src, const mx::Shape& shape, const mx::Strides& strides,
                    float* dst) {
  int nd = static_cast<int>(shape.size());
  std::vector<int> index(nd, 0);
  size_t total = 1;
  for (int d : shape) {
    total *= static_cast<size_t>(d);
  }
  for (size_t i = 0; i < total; ++i) {
    int64_t at = 0;
    for (int d = 0; d < nd; ++d) {
      at += index[d] * strides[d];
    }
    dst[i] = src[at];
    for (int d = nd - 1; d >= 0 && ++index[d] == shape[d]; --d) {
      index[d] = 0;
    }
  }
}

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
