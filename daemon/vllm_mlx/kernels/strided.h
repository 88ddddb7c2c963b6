// Reading arrays whose layout is unknown when a graph node is built: a node that takes
// any layout saves the `contiguous` node (a few microseconds each on the CPU, hundreds
// of them per decode step) that would otherwise sit in front of it.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"

namespace vllm_mlx_kernels {

namespace mx = mlx::core;

// Copies a strided array (src points at its first element) into row-major order; dst
// holds the product of shape. The trailing dimensions that are laid out row-major in src
// (a slice along an outer axis, such as a batch cache's positions after its left padding
// is dropped) are copied as whole runs: an element-by-element walk took hundreds of ms
// for a decode step's caches (docs/benchmarks.md, round 22).
template <typename T>
void gather_strided(const T* src, const mx::Shape& shape, const mx::Strides& strides, T* dst) {
  int nd = static_cast<int>(shape.size());
  size_t total = 1;
  for (int d : shape) {
    total *= static_cast<size_t>(d);
  }
  if (total == 0) {
    return;
  }
  // The longest suffix of dimensions that is row-major in src: one run of `run` elements.
  int outer = nd;
  size_t run = 1;
  while (outer > 0 && (shape[outer - 1] == 1 ||
                       strides[outer - 1] == static_cast<int64_t>(run))) {
    run *= static_cast<size_t>(shape[outer - 1]);
    --outer;
  }
  std::vector<int> index(outer, 0);
  for (size_t i = 0; i < total; i += run) {
    int64_t at = 0;
    for (int d = 0; d < outer; ++d) {
      at += index[d] * strides[d];
    }
    std::copy(src + at, src + at + run, dst + i);
    for (int d = outer - 1; d >= 0 && ++index[d] == shape[d]; --d) {
      index[d] = 0;
    }
  }
}

// x's floats in row-major order, for a task dispatched from eval_cpu: x's own buffer when
// it is row-contiguous; otherwise a buffer the encoder keeps alive, which `fill` (to run
// first, inside the task) copies x into.
struct RowMajor {
  const float* data;
  std::function<void()> fill;
};
RowMajor row_major(const mx::array& x, mx::cpu::CommandEncoder& encoder);

// A scratch buffer of `count` floats for a dispatched task, from MLX's allocator (whose
// cache hands the same memory back step after step: no fresh pages to fault in) and
// kept alive by the encoder until the task has run. Not initialised.
float* temporary_floats(size_t count, mx::cpu::CommandEncoder& encoder);

// The stream an op of the extension builds its node on: s, which must be a CPU stream
// (std::invalid_argument "vllm_mlx <op> runs on the CPU only" otherwise).
mx::Stream cpu_stream(mx::StreamOrDevice s, const char* op);

} // namespace vllm_mlx_kernels
