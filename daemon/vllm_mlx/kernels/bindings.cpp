#include <nanobind/nanobind.h>
#include <nanobind/stl/variant.h>

#include "qmm.h"
#include "qmm_kernel.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_qmm, m) {
  m.doc() = "vllm-mlx: a vectorised, multi-threaded CPU kernel for affine-quantized matmul";
  m.def(
      "quantized_matmul", &vllm_mlx_kernels::quantized_matmul, "x"_a, "w"_a, "scales"_a,
      "biases"_a, "group_size"_a, "bits"_a, "max_rows"_a = 32, nb::kw_only(),
      "stream"_a = nb::none(),
      "x @ dequantize(w, scales, biases).T on the CPU; rows beyond max_rows use BLAS.");
  m.def("set_threads", &vllm_mlx_kernels::set_threads, "n"_a, "Threads per matmul.");
  m.def("threads", &vllm_mlx_kernels::threads, "Threads per matmul.");
  m.def("isa", &vllm_mlx_kernels::isa, "The instruction set in use: avx2 or scalar.");
  m.def("supported", &vllm_mlx_kernels::supported, "bits"_a, "group_size"_a);
}
