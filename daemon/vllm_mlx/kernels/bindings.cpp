#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "act.h"
#include "attn.h"
#include "layer.h"
#include "logsumexp.h"
#include "norm.h"
#include "qmm.h"
#include "qmm_kernel.h"
#include "thread_pool.h"

namespace nb = nanobind;
namespace mx = mlx::core;
using namespace nb::literals;

NB_MODULE(_qmm, m) {
  m.doc() = "vllm-mlx: a vectorised, multi-threaded CPU kernel for affine-quantized matmul";
  m.def(
      "quantized_matmul", &vllm_mlx_kernels::quantized_matmul, "x"_a, "w"_a, "scales"_a,
      "biases"_a, "group_size"_a, "bits"_a, "max_rows"_a = 32, nb::kw_only(),
      "int8"_a = false, "stream"_a = nb::none(),
      "x @ dequantize(w, scales, biases).T on the CPU; rows beyond max_rows use BLAS. "
      "int8: int8 activations where int8_available().");
  m.def(
      "quantized_matmul_many", &vllm_mlx_kernels::quantized_matmul_many, "x"_a, "ws"_a,
      "scales"_a, "biases"_a, "group_size"_a, "bits"_a, "max_rows"_a = 32, nb::kw_only(),
      "int8"_a = false, "stream"_a = nb::none(),
      "[quantized_matmul(x, w, s, b, ...) for each set] as one node and one thread split; "
      "the same bits as the calls one by one.");
  m.def("softmax_prefill", &vllm_mlx_kernels::softmax_prefill, "scores"_a, "M"_a, "causal"_a,
        "mask"_a = nb::none(), nb::kw_only(), "stream"_a = nb::none(),
        "The softmax of prefill attention scores, causal and/or masked, threaded.");
  m.def("dequantize", &vllm_mlx_kernels::dequantize, "w"_a, "scales"_a, "biases"_a,
        "group_size"_a, "bits"_a, nb::kw_only(), "stream"_a = nb::none(),
        "Affine dequantize to float32 on every core (what the prefill path uses).");
  m.def("swiglu", &vllm_mlx_kernels::swiglu, "gate"_a, "up"_a, nb::kw_only(),
        "stream"_a = nb::none(),
        "silu(gate) * up for float32 arrays of one shape, bit-identical to mlx_lm's swiglu.");
  m.def("logsumexp", &vllm_mlx_kernels::logsumexp, "x"_a, nb::kw_only(), "stream"_a = nb::none(),
        "mx.logsumexp(x, axis=-1, keepdims=True) for float32 on the CPU, the same bits.");
  m.def("categorical_draw", &vllm_mlx_kernels::categorical_draw, "logits"_a, "uniform"_a,
        nb::kw_only(), "stream"_a = nb::none(),
        "One token per row drawn from softmax(logits) at the row's uniform value (CPU).");
  m.def("rms_norm", &vllm_mlx_kernels::rms_norm, "x"_a, "weight"_a, "eps"_a, nb::kw_only(),
        "stream"_a = nb::none(), "mx.fast.rms_norm for float32, as one CPU graph node.");
  m.def("rope", &vllm_mlx_kernels::rope, "x"_a, "dims"_a, "traditional"_a, "base"_a,
        "scale"_a, "offset"_a, "freqs"_a = nb::none(), nb::kw_only(), "stream"_a = nb::none(),
        "mx.fast.rope for float32 (offset: an int32 array), as one CPU graph node.");
  m.def("sdpa_decode", &vllm_mlx_kernels::sdpa_decode, "q"_a, "k"_a, "v"_a, "scale"_a,
        "mask"_a = nb::none(), nb::kw_only(), "causal"_a = false, "stream"_a = nb::none(),
        "mx.fast.scaled_dot_product_attention for 1 to 64 float32 query positions (decode, "
        "short chunks); causal: query m sees keys up to T - M + m.");
  m.def("sdpa_decode_quantized", &vllm_mlx_kernels::sdpa_decode_quantized, "q"_a, "k"_a, "v"_a,
        "scale"_a, "group_size"_a, "bits"_a, "mask"_a = nb::none(), nb::kw_only(),
        "causal"_a = false, "stream"_a = nb::none(),
        "sdpa_decode over a quantized KV cache: k and v are (words, scales, biases) triples.");
  m.def("sdpa_decode_append", &vllm_mlx_kernels::sdpa_decode_append, "q"_a, "k"_a, "v"_a,
        "k_cache"_a, "v_cache"_a, "position"_a, "scale"_a, "mask"_a = nb::none(),
        nb::kw_only(), "stream"_a = nb::none(),
        "k and v written at `position` of the caches, then sdpa_decode over positions 0.."
        "position: (attention, k_cache, v_cache), the caches' buffers reused when free.");
  // Builds from before several positions have no attribute: callers read 1 then.
  m.attr("SDPA_DECODE_MAX_QUERIES") = vllm_mlx_kernels::kMaxDecodeQueries;
  m.def("sdpa_prefill", &vllm_mlx_kernels::sdpa_prefill, "q"_a, "k"_a, "v"_a, "scale"_a,
        "causal"_a, "mask"_a = nb::none(), nb::kw_only(), "stream"_a = nb::none(),
        "Fused causal / masked float32 attention for several query positions (prefill).");
  m.def("sdpa_prefill_quantized", &vllm_mlx_kernels::sdpa_prefill_quantized, "q"_a, "k"_a,
        "v"_a, "scale"_a, "group_size"_a, "bits"_a, "causal"_a, "mask"_a = nb::none(),
        nb::kw_only(), "stream"_a = nb::none(),
        "sdpa_prefill over a quantized KV cache: k and v are (words, scales, biases) "
        "triples, a block of keys dequantized at a time.");
  m.def(
      "decoder_attention_inputs",
      [](const mx::array& x, const mx::array& norm_weight, float eps,
         const std::vector<mx::array>& qkv, int group_size, int bits, bool int8, int n_heads,
         int n_kv_heads, int head_dim, int rope_dims, bool traditional,
         std::optional<float> base, float rope_scale, const mx::array& offset,
         const std::optional<mx::array>& freqs, mx::StreamOrDevice s) {
        return vllm_mlx_kernels::decoder_attention_inputs(
            x, norm_weight, eps, qkv, {group_size, bits}, int8, n_heads, n_kv_heads, head_dim,
            rope_dims, traditional, base, rope_scale, offset, freqs, s);
      },
      "x"_a, "norm_weight"_a, "eps"_a, "qkv"_a, "group_size"_a, "bits"_a, "int8"_a,
      "n_heads"_a, "n_kv_heads"_a, "head_dim"_a, "rope_dims"_a, "traditional"_a, "base"_a,
      "rope_scale"_a, "offset"_a, "freqs"_a = nb::none(), nb::kw_only(), "stream"_a = nb::none(),
      "A decoder layer's [rope(q), rope(k), v] at one position per row, from its input x "
      "(B, 1, D): the norm, the q/k/v products and the rotary embedding in one node.");
  m.def(
      "decoder_mlp_residual",
      [](const mx::array& attention, const mx::array& x, const std::vector<mx::array>& o,
         std::tuple<int, int> o_quantization, const mx::array& norm_weight, float eps,
         const std::vector<mx::array>& gate_up, std::tuple<int, int> gate_up_quantization,
         const std::vector<mx::array>& down, std::tuple<int, int> down_quantization, bool int8,
         mx::StreamOrDevice s) {
        auto q = [](std::tuple<int, int> t) {
          return vllm_mlx_kernels::Quantization{std::get<0>(t), std::get<1>(t)};
        };
        return vllm_mlx_kernels::decoder_mlp_residual(
            attention, x, o, q(o_quantization), norm_weight, eps, gate_up,
            q(gate_up_quantization), down, q(down_quantization), int8, s);
      },
      "attention"_a, "x"_a, "o"_a, "o_quantization"_a, "norm_weight"_a, "eps"_a, "gate_up"_a,
      "gate_up_quantization"_a, "down"_a, "down_quantization"_a, "int8"_a, nb::kw_only(),
      "stream"_a = nb::none(),
      "The rest of a decoder layer at one position per row: h = x + o(attention), then "
      "h + down(swiglu(gate(n), up(n))) with n = rms_norm(h), in one node. Quantizations "
      "are (group_size, bits).");
  m.def("set_threads", &vllm_mlx_kernels::set_threads, "n"_a, "Threads per matmul.");
  m.def("threads", &vllm_mlx_kernels::threads, "Threads per matmul.");
  m.def("isa", &vllm_mlx_kernels::isa, "The instruction set in use: avx512, avx2 or scalar.");
  m.def("set_isa", &vllm_mlx_kernels::set_isa, "name"_a,
        "Force an instruction set (best, avx512, avx2, scalar); ValueError if unsupported.");
  m.def("granted_isa", &vllm_mlx_kernels::granted_isa, "leaf1_ecx"_a, "leaf7_ebx"_a, "xcr0"_a,
        "The x86-64 set a CPU with these CPUID.1:ECX, CPUID.7.0:EBX and XCR0 bits grants.");
  m.def("granted_int8", &vllm_mlx_kernels::granted_int8, "leaf1_ecx"_a, "leaf7_ebx"_a,
        "leaf7_ecx"_a, "xcr0"_a,
        "Whether a CPU with these bits grants the VNNI int8 (AVX-512 VNNI) tiles.");
  m.def("int8_tiles", &vllm_mlx_kernels::int8_tiles,
        "The int8 tiles int8=True takes here: vnni, avx2 or none (by the set in use).");
  m.def("int8_available", &vllm_mlx_kernels::int8_available,
        "Whether int8=True takes int8 tiles here (int8_tiles() is not none).");
  m.def(
      "cpu_bits",
      [] {
        vllm_mlx_kernels::CpuBits bits = vllm_mlx_kernels::cpu_bits();
        return std::make_tuple(bits.leaf1_ecx, bits.leaf7_ebx, bits.xcr0);
      },
      "This machine's (CPUID.1:ECX, CPUID.7.0:EBX, XCR0) as granted_isa takes them.");
  m.def(
      "cpu_leaf7_ecx", [] { return vllm_mlx_kernels::cpu_bits().leaf7_ecx; },
      "This machine's CPUID.7.0:ECX, as granted_int8 takes it.");
  m.def("set_parallel_min", &vllm_mlx_kernels::set_parallel_min, "work"_a,
        "Matmuls with less work (rows_out x inputs x (rows + 2)) stay on one thread.");
  m.def("parallel_min", &vllm_mlx_kernels::parallel_min);
  m.def("set_worker_spin_us", &vllm_mlx_kernels::set_worker_spin_us, "us"_a,
        "How long (microseconds) an idle pool worker spins for the next job before sleeping.");
  m.def("worker_spin_us", &vllm_mlx_kernels::worker_spin_us);
  m.def("set_prefetch_distance", &vllm_mlx_kernels::set_prefetch_distance, "bytes"_a,
        "How far ahead (bytes) the x86-64 tiles prefetch their weights into L2; 0: off.");
  m.def("prefetch_distance", &vllm_mlx_kernels::prefetch_distance);
  m.def("supported", &vllm_mlx_kernels::supported, "bits"_a, "group_size"_a);
}
