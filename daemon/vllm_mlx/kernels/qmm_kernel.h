// Affine-quantized matmul on the CPU: y[m, n] = sum_k x[m, k] * (s[n, g] * q[n, k] + b[n, g]),
// g = k / group_size, with the packed layout mx.quantize writes (uint32 words, low bits
// first, rows of w along the output dimension, i.e. quantized_matmul(transpose=True)).
#pragma once

#include <cstdint>
#include <string>

namespace vllm_mlx_kernels {

enum class ScaleType { f32, f16, bf16 };

struct QmmProblem {
  const float* x; // [M, K] row-major
  const uint32_t* w; // [N, K * bits / 32]
  const void* scales; // [N, K / group_size] of scale_type
  const void* biases; // same shape and type as scales
  float* y; // [M, N] row-major
  int M;
  int N;
  int K;
  int group_size; // 32, 64 or 128
  int bits; // 4 or 8
  ScaleType scale_type;
  // Quantize x to int8 per 32 values and use the int8 tiles (qmm_int8.h: int8_tiles())
  // where there are any; otherwise the exact tiles. Opt-in: changes the product.
  bool int8 = false;
};

// Whether (bits, group_size) has a kernel.
bool supported(int bits, int group_size);

// Computes y; splits the output rows over the pool's threads when worth it.
void qmm(const QmmProblem& p);

// Several products of one x (a layer's q, k and v projections; an MLP's gate and up): the
// problems share x, M, K, group_size, bits, scale_type and int8 and differ in w, scales,
// biases, N and y. x is prepared once and every output row of every problem goes to one
// split over the pool, so the call costs one hand-off instead of `count`. Each output row
// is computed exactly as qmm computes it (the same bits). std::invalid_argument when the
// shared fields differ.
void qmm_many(const QmmProblem* problems, int count);

// Threads used per call (>= 1); the pool is resized on the next call.
void set_threads(int n);
int threads();

// Matmuls with less work than this (output rows x inputs x (rows + 2)) run on one thread.
void set_parallel_min(long work);
long parallel_min();

// How far ahead (bytes) the x86-64 tiles prefetch their weights into L2; 0: off.
void set_prefetch_distance(long bytes);
long prefetch_distance();

// The instruction set in use: "avx512", "avx2", "neon" or "scalar" (the best the CPU has, unless
// set_isa chose another: "best" or one of those; std::invalid_argument if the CPU lacks it).
const char* isa();
void set_isa(const std::string& name);

// The x86-64 instruction set a CPU grants, "avx512", "avx2" or "scalar", from its raw bits:
// CPUID.1:ECX, CPUID.(EAX=7,ECX=0):EBX and XCR0 (the register state the OS saves; 0 when
// CPUID.1:ECX.OSXSAVE is clear). Pure, so tests can feed it machines we do not have; on
// x86-64 the default isa() is granted_isa() of cpu_bits().
const char* granted_isa(uint32_t leaf1_ecx, uint32_t leaf7_ebx, uint64_t xcr0);

// Whether a CPU with these bits grants the VNNI int8 tiles: the AVX-512 set plus AVX512BW,
// AVX512VL (CPUID.7.0:EBX) and AVX512_VNNI (CPUID.7.0:ECX). Pure, as granted_isa.
bool granted_int8(uint32_t leaf1_ecx, uint32_t leaf7_ebx, uint32_t leaf7_ecx, uint64_t xcr0);

// Which int8 tiles p.int8 takes here: "vnni" (the set in use is avx512 and the CPU grants
// VNNI), "avx2" (the set in use is avx2, or avx512 without VNNI) or "none" (scalar, NEON:
// the flag changes nothing).
const char* int8_tiles();
bool int8_available(); // int8_tiles() is not "none"

// This machine's bits, as granted_isa and granted_int8 take them (all 0 off x86-64).
struct CpuBits {
  uint32_t leaf1_ecx;
  uint32_t leaf7_ebx;
  uint64_t xcr0;
  uint32_t leaf7_ecx;
};
CpuBits cpu_bits();

// The matmul's thread pool, for the other kernels (one set of workers per process).
class ThreadPool;
ThreadPool& shared_pool();

} // namespace vllm_mlx_kernels
