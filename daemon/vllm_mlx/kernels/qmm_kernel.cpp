#include "qmm_kernel.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "qmm_internal.h"
#include "thread_pool.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace vllm_mlx_kernels {

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else { // subnormal: renormalise
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// 8 KiB: 8-16 KiB measured alike for the bundled model's products on Zen 4 (2 KiB
// ahead gained half as much); see qmm_internal.h.
std::atomic<long> g_prefetch_distance{8192};

namespace {

enum class Isa { scalar, avx2, avx512, neon };
constexpr const char* kIsaNames[] = {"scalar", "avx2", "avx512", "neon"};

// A matmul whose work (output rows x inputs x (rows + 2): unpacking a weight costs about
// two rows' FMAs) is under this stays on one thread: handing half of it to a sleeping
// worker costs more than it saves. Measured with bench/qmm_layers.py (docs/benchmarks.md);
// lowered from 1 << 22 when the decode step's down projection (2.65 M at one row) measured
// 4-9% faster split (round 8), q/k/v (1.66 M) and o (1 M) not.
// Atomics: tests and benchmarks change these while MLX streams may be running matmuls.
std::atomic<long> g_parallel_min{1L << 21};
std::atomic<int> g_threads{0}; // 0: not set, use the default

int default_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(std::min(n, 16u));
}

ThreadPool& pool() {
  // Never destroyed: joining workers during static destruction at exit can deadlock.
  static ThreadPool* p = new ThreadPool();
  return *p;
}

// The x86-64 sets by what the CPU grants, not only what it advertises. CPUID says which
// instructions exist; XCR0 says which registers the OS saves across context switches, and
// an instruction whose registers are not enabled there faults (#UD: SIGILL). A VM can
// advertise AVX-512 in CPUID while its guest XCR0 has no zmm state, so both are checked.
// libgcc's __builtin_cpu_supports checks XCR0 too, but here the decision is ours, and a
// pure function of the bits, so tests/unit/test_isa_dispatch.py can feed it such machines.
//
// CPUID.1:ECX
constexpr uint32_t kFma = 1u << 12;
constexpr uint32_t kOsxsave = 1u << 27; // the OS enabled XSAVE: xgetbv (XCR0) may be run
constexpr uint32_t kAvx = 1u << 28;
constexpr uint32_t kF16c = 1u << 29;
// CPUID.(EAX=7,ECX=0):EBX
constexpr uint32_t kAvx2 = 1u << 5;
constexpr uint32_t kAvx512f = 1u << 16;
constexpr uint32_t kAvx512bw = 1u << 30; // the int8 tiles' byte masks and shifts
constexpr uint32_t kAvx512vl = 1u << 31; // their 128/256-bit masked loads
// CPUID.(EAX=7,ECX=0):ECX
constexpr uint32_t kAvx512Vnni = 1u << 11; // vpdpbusd
// XCR0 bits 1-2: xmm and the upper halves of ymm; 5-7: opmask (k0-k7), the upper halves
// of zmm0-15 (ZMM_Hi256), zmm16-31 (Hi16_ZMM).
constexpr uint64_t kXcr0Ymm = 0x6;
constexpr uint64_t kXcr0Zmm = 0xe0;

// The AVX2 functions are target("avx2,fma[,f16c]"), the AVX-512 ones
// target("avx512f,avx2,fma[,f16c]"): AVX512F alone, no BW/VL/DQ/FP16. The compiler emits
// nothing and accepts no intrinsic from a subset the target does not name, so requiring
// more would only turn away CPUs that run the tiles (Knights Landing: F without BW/VL/DQ).
// test_isa_dispatch.py fails if a target attribute names a feature not checked here.
// SSE3 to SSE4.2, which "avx2" lets the compiler use too, come with every CPU that has AVX:
// not checked.
// No AMX anywhere: it would also need XCR0 bits 17-18 (XTILECFG, XTILEDATA) and, on Linux,
// the process's permission (arch_prctl(ARCH_REQ_XCOMP_PERM)), without which the first tile
// instruction faults though CPUID and XCR0 both show AMX. Its CPUID bits (leaf 7, EDX) are
// not read at all.
Isa isa_granted(uint32_t leaf1_ecx, uint32_t leaf7_ebx, uint64_t xcr0) {
  if ((leaf1_ecx & kOsxsave) == 0) {
    xcr0 = 0; // unreadable (xgetbv would fault): the OS saves no ymm or zmm state
  }
  constexpr uint32_t avx2_ecx = kOsxsave | kAvx | kFma | kF16c;
  bool avx2 = (leaf1_ecx & avx2_ecx) == avx2_ecx && (leaf7_ebx & kAvx2) != 0 &&
      (xcr0 & kXcr0Ymm) == kXcr0Ymm;
  if (!avx2) {
    return Isa::scalar;
  }
  bool avx512 = (leaf7_ebx & kAvx512f) != 0 && (xcr0 & kXcr0Zmm) == kXcr0Zmm;
  return avx512 ? Isa::avx512 : Isa::avx2;
}

bool available(Isa isa) {
#if defined(__x86_64__)
  static const Isa granted = [] {
    CpuBits bits = cpu_bits();
    return isa_granted(bits.leaf1_ecx, bits.leaf7_ebx, bits.xcr0);
  }();
  return isa == Isa::scalar || (isa == Isa::avx2 && granted != Isa::scalar) ||
      (isa == Isa::avx512 && granted == Isa::avx512);
#elif defined(__aarch64__)
  return isa == Isa::scalar || isa == Isa::neon; // NEON is part of every arm64 CPU
#else
  return isa == Isa::scalar;
#endif
}

Isa best_isa() {
  for (Isa isa : {Isa::avx512, Isa::avx2, Isa::neon}) {
    if (available(isa)) {
      return isa;
    }
  }
  return Isa::scalar;
}

std::atomic<Isa> g_isa{best_isa()};

#if defined(__x86_64__)
bool int8_granted_here() {
  static const bool granted = [] {
    CpuBits bits = cpu_bits();
    return granted_int8(bits.leaf1_ecx, bits.leaf7_ebx, bits.leaf7_ecx, bits.xcr0);
  }();
  return granted;
}
#endif

// Row n's scales (or biases) as float32 for the portable path: a pointer into the input
// when it already is.
const float* row_as_float(const QmmProblem& p, const void* base, int n, float* buf) {
  int groups = p.K / p.group_size;
  size_t offset = static_cast<size_t>(n) * groups;
  if (p.scale_type == ScaleType::f32) {
    return static_cast<const float*>(base) + offset;
  }
  const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
  for (int g = 0; g < groups; ++g) {
    buf[g] = p.scale_type == ScaleType::f16 ? half_to_float(src[g]) : bf16_to_float(src[g]);
  }
  return buf;
}

// x for the tiles; with `sums`, also x's sum over each group (the bias term of the tiles
// that scale a group's sum of q * x: NEON and the portable loops).
void prepare(const QmmProblem& p, int block, bool sums, Prepared& out) {
  int groups = p.K / p.group_size;
  out.x.resize(static_cast<size_t>(p.M) * p.K);
  out.sums.resize(sums ? static_cast<size_t>(p.M) * groups : 0);
  for (int m = 0; m < p.M; ++m) {
    const float* src = p.x + static_cast<size_t>(m) * p.K;
    float* dst = out.x.data() + static_cast<size_t>(m) * p.K;
    if (block > 0) {
      for (int k0 = 0; k0 < p.K; k0 += 2 * block) {
        for (int t = 0; t < block; ++t) {
          dst[k0 + t] = src[k0 + 2 * t];
          dst[k0 + block + t] = src[k0 + 2 * t + 1];
        }
      }
    } else {
      std::memcpy(dst, src, sizeof(float) * p.K);
    }
    for (int g = 0; sums && g < groups; ++g) {
      float s = 0.0f;
      for (int k = g * p.group_size; k < (g + 1) * p.group_size; ++k) {
        s += src[k];
      }
      out.sums[static_cast<size_t>(m) * groups + g] = s;
    }
  }
}

// Portable path (arm64 Linux, x86 without AVX2): unpack a group, then plain loops the
// compiler can vectorise. Reads x in its natural order.
void rows_scalar(const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  int groups = p.K / p.group_size;
  int per_word = 32 / p.bits;
  uint32_t mask = (1u << p.bits) - 1;
  std::vector<float> sbuf(groups), bbuf(groups);
  float wq[128];
  std::vector<float> acc(p.M);
  for (int n = n_begin; n < n_end; ++n) {
    const float* s = row_as_float(p, p.scales, n, sbuf.data());
    const float* b = row_as_float(p, p.biases, n, bbuf.data());
    const uint32_t* w = p.w + static_cast<size_t>(n) * (p.K / per_word);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int g = 0; g < groups; ++g) {
      int k0 = g * p.group_size;
      for (int k = 0; k < p.group_size; ++k) {
        int idx = k0 + k;
        wq[k] = static_cast<float>((w[idx / per_word] >> ((idx % per_word) * p.bits)) & mask);
      }
      for (int m = 0; m < p.M; ++m) {
        const float* x = p.x + static_cast<size_t>(m) * p.K + k0;
        float dot = 0.0f;
        for (int k = 0; k < p.group_size; ++k) {
          dot += wq[k] * x[k];
        }
        acc[m] += s[g] * dot + b[g] * xp.sums[static_cast<size_t>(m) * groups + g];
      }
    }
    for (int m = 0; m < p.M; ++m) {
      p.y[static_cast<size_t>(m) * p.N + n] = acc[m];
    }
  }
}

void rows(Isa isa, const QmmProblem& p, const Prepared& xp, int n_begin, int n_end) {
  // Each set's tiles exist only in builds for its architecture (the other files compile
  // to nothing), so only those may be named here; available() never picks the others.
  switch (isa) {
#if defined(__x86_64__)
    case Isa::avx512: rows_avx512(p, xp, n_begin, n_end); break;
    case Isa::avx2: rows_avx2(p, xp, n_begin, n_end); break;
#elif defined(__aarch64__)
    case Isa::neon: rows_neon(p, xp, n_begin, n_end); break;
#endif
    default: rows_scalar(p, xp, n_begin, n_end); break;
  }
}

} // namespace

const char* granted_isa(uint32_t leaf1_ecx, uint32_t leaf7_ebx, uint64_t xcr0) {
  return kIsaNames[static_cast<int>(isa_granted(leaf1_ecx, leaf7_ebx, xcr0))];
}

bool granted_int8(uint32_t leaf1_ecx, uint32_t leaf7_ebx, uint32_t leaf7_ecx, uint64_t xcr0) {
  constexpr uint32_t need_ebx = kAvx512bw | kAvx512vl;
  return isa_granted(leaf1_ecx, leaf7_ebx, xcr0) == Isa::avx512 &&
      (leaf7_ebx & need_ebx) == need_ebx && (leaf7_ecx & kAvx512Vnni) != 0;
}

namespace {

enum class Int8Tiles { none, avx2, vnni };

Int8Tiles int8_tiles_for(Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::avx512 && int8_granted_here()) {
    return Int8Tiles::vnni;
  }
  // Every AVX-512 CPU has AVX2 (granted_isa requires it first).
  return isa == Isa::avx2 || isa == Isa::avx512 ? Int8Tiles::avx2 : Int8Tiles::none;
#else
  (void)isa;
  return Int8Tiles::none;
#endif
}

} // namespace

const char* int8_tiles() {
  constexpr const char* names[] = {"none", "avx2", "vnni"};
  return names[static_cast<int>(int8_tiles_for(g_isa.load()))];
}

bool int8_available() {
  return int8_tiles_for(g_isa.load()) != Int8Tiles::none;
}

CpuBits cpu_bits() {
  CpuBits bits{0, 0, 0, 0};
#if defined(__x86_64__)
  unsigned eax, ebx, ecx, edx;
  // Each returns 0, leaving the bits 0, when the leaf is beyond the CPU's highest one.
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
    bits.leaf1_ecx = ecx;
  }
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    bits.leaf7_ebx = ebx;
    bits.leaf7_ecx = ecx;
  }
  if (bits.leaf1_ecx & kOsxsave) {
    // xgetbv by hand: the _xgetbv intrinsic would need target("xsave") here.
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    bits.xcr0 = static_cast<uint64_t>(hi) << 32 | lo;
  }
#endif
  return bits;
}

ThreadPool& shared_pool() {
  return pool();
}

bool supported(int bits, int group_size) {
  return (bits == 4 || bits == 8) &&
      (group_size == 32 || group_size == 64 || group_size == 128);
}

void set_threads(int n) {
  g_threads = std::max(1, n);
}

int threads() {
  int n = g_threads.load();
  return n > 0 ? n : default_threads();
}

void set_parallel_min(long work) {
  g_parallel_min = std::max(0L, work);
}

long parallel_min() {
  return g_parallel_min;
}

void set_prefetch_distance(long bytes) {
  g_prefetch_distance = std::max(0L, bytes);
}

long prefetch_distance() {
  return g_prefetch_distance;
}

const char* isa() {
  return kIsaNames[static_cast<int>(g_isa.load())];
}

void set_isa(const std::string& name) {
  for (Isa candidate : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::neon}) {
    if (name == kIsaNames[static_cast<int>(candidate)]) {
      if (!available(candidate)) {
        throw std::invalid_argument("this CPU has no " + name);
      }
      g_isa = candidate;
      return;
    }
  }
  if (name != "best") {
    throw std::invalid_argument("isa must be best, avx512, avx2, neon or scalar, not " + name);
  }
  g_isa = best_isa();
}

// rows_of(problem, n_begin, n_end) over every output row of `count` problems, split over
// the pool when their total work is worth it.
template <class Rows>
void split_rows(const QmmProblem* problems, int count, const Rows& rows_of) {
  long work = 0;
  int all_n = 0;
  for (int i = 0; i < count; ++i) {
    const QmmProblem& p = problems[i];
    work += static_cast<long>(p.N) * p.K * (p.M + 2);
    all_n += p.N;
  }
  int n_threads = work < g_parallel_min ? 1 : std::min(threads(), all_n / 16);
  if (n_threads <= 1) {
    for (int i = 0; i < count; ++i) {
      rows_of(problems[i], 0, problems[i].N);
    }
    return;
  }
  // Chunks of whole 4-row tiles, about 4 per thread over all the problems, so a late
  // worker costs one chunk; a chunk never spans two problems.
  int per = std::max(16, (all_n / (4 * n_threads) + 3) / 4 * 4);
  struct Chunk {
    int problem, n0, n1;
  };
  thread_local std::vector<Chunk> chunk_list; // reused: ~200 calls a decode step
  std::vector<Chunk>& chunks = chunk_list;
  chunks.clear();
  for (int i = 0; i < count; ++i) {
    for (int n0 = 0; n0 < problems[i].N; n0 += per) {
      chunks.push_back({i, n0, std::min(problems[i].N, n0 + per)});
    }
  }
  pool().run(n_threads, static_cast<int>(chunks.size()), [&](int c) {
    const Chunk& chunk = chunks[c];
    rows_of(problems[chunk.problem], chunk.n0, chunk.n1);
  });
}

void check_shared(const QmmProblem* problems, int count) {
  for (int i = 1; i < count; ++i) {
    const QmmProblem& a = problems[0];
    const QmmProblem& b = problems[i];
    if (a.x != b.x || a.M != b.M || a.K != b.K || a.group_size != b.group_size ||
        a.bits != b.bits || a.scale_type != b.scale_type || a.int8 != b.int8) {
      throw std::invalid_argument(
          "qmm_many: the problems must share x, M, K, group size, bits, scale type and int8");
    }
  }
}

void qmm_many(const QmmProblem* problems, int count) {
  if (count <= 0) {
    return;
  }
  check_shared(problems, count);
  const QmmProblem& first = problems[0];
  // thread_local: the buffers outlive the call. Workers get them through a reference, since
  // naming a thread_local inside the lambda would name the worker's own (empty) copy.
  const Isa isa = g_isa; // one instruction set for the whole call (x's layout is per set)
#if defined(__x86_64__)
  const Int8Tiles int8 = first.int8 ? int8_tiles_for(isa) : Int8Tiles::none;
  if (int8 != Int8Tiles::none) {
    thread_local PreparedInt8 prepared;
    const bool vnni = int8 == Int8Tiles::vnni;
    (vnni ? prepare_int8_vnni : prepare_int8_avx2)(first, prepared);
    const PreparedInt8& xp = prepared;
    split_rows(problems, count, [&](const QmmProblem& p, int n0, int n1) {
      (vnni ? rows_int8_vnni : rows_int8_avx2)(p, xp, n0, n1);
    });
    return;
  }
#endif
  thread_local Prepared prepared;
  const Prepared& xp = prepared;
  int block = first.bits != 4 || isa == Isa::scalar ? 0 : isa == Isa::avx512 ? 16 : 8;
  // The AVX2 and AVX-512 tiles dequantize each weight (s * q + b): no group sums.
  const bool sums = isa == Isa::scalar || isa == Isa::neon;
  prepare(first, block, sums, prepared);
  split_rows(problems, count, [&](const QmmProblem& p, int n0, int n1) {
    rows(isa, p, xp, n0, n1);
  });
}

void qmm(const QmmProblem& p) {
  qmm_many(&p, 1);
}

} // namespace vllm_mlx_kernels
