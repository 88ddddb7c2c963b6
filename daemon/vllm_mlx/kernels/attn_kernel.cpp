// Decode attention, per (sequence, KV head): the G query heads x M positions that share the
// KV head are handled together, up to kBlock rows at a time over a tile of 64 positions
// that stays in L1 for the next block, so each K and V row crosses the memory bus once:
//   1. scores[g, t] = (q[g] * scale) . k[t]       (q scaled first, as MLX's fallback does)
//   2. the mask: bool -> the float minimum where false (finite, like MLX's where()), or added
//   3. softmax as MLX's precise CPU softmax: max, exp(x - max) with MLX's exp, * 1 / sum
//   4. out[g] = sum over t of p[g, t] * v[t]
// Each output element's operations depend only on D, Dv and T, never on the block, the batch
// or the thread that computes it (batch invariance); the sums differ from BLAS's order, so
// results match MLX's to rounding, not bit for bit.
#include "attn_kernel.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "act_kernel.h"
#include "attn_decode_internal.h"
#include "qmm_kernel.h"
#include "thread_pool.h"

namespace vllm_mlx_kernels {

namespace decode {

namespace {

void scores_scalar(const float* qs, int ng, int D, const float* k, int64_t kst, int T,
                   float* s, int64_t sst) {
  for (int t = 0; t < T; ++t) {
    const float* kr = k + t * kst;
    for (int j = 0; j < ng; ++j) {
      float acc = 0.0f;
      for (int d = 0; d < D; ++d) {
        acc += qs[j * D + d] * kr[d];
      }
      s[j * sst + t] = acc;
    }
  }
}

void pv_scalar(const float* pr, int64_t sst, int ng, int T, const float* v, int64_t vst, int Dv,
               float* out, int64_t ost, bool add) {
  if (!add) {
    for (int j = 0; j < ng; ++j) {
      std::fill(out + j * ost, out + j * ost + Dv, 0.0f);
    }
  }
  for (int t = 0; t < T; ++t) {
    const float* vr = v + t * vst;
    for (int j = 0; j < ng; ++j) {
      float pj = pr[j * sst + t];
      for (int d = 0; d < Dv; ++d) {
        out[j * ost + d] += pj * vr[d];
      }
    }
  }
}

} // namespace

void dequant_scalar(const uint32_t* w, const float* scales, const float* biases, int D,
                    int group_size, int bits, float* out) {
  const int per_word = 32 / bits;
  const uint32_t low = (1u << bits) - 1;
  for (int i = 0; i < D; ++i) {
    uint32_t q = (w[i / per_word] >> ((i % per_word) * bits)) & low;
    float scaled = scales[i / group_size] * static_cast<float>(q);
    out[i] = scaled + biases[i / group_size];
  }
}

Steps steps_scalar() {
  return {scores_scalar, pv_scalar, dequant_scalar};
}

void dequant_rows(const QuantizedRows& rows, DequantFn dequant, int group_size, int bits,
                  int b, int kh, int t0, int n, int dim, float* out) {
  for (int i = 0; i < n; ++i) {
    const int64_t t = t0 + i;
    const uint32_t* w = rows.words + b * rows.words_strides[0] + kh * rows.words_strides[1] +
                        t * rows.words_strides[2];
    const float* sc = rows.scales + b * rows.scales_strides[0] + kh * rows.scales_strides[1] +
                      t * rows.scales_strides[2];
    const float* bi = rows.biases + b * rows.biases_strides[0] + kh * rows.biases_strides[1] +
                      t * rows.biases_strides[2];
    dequant(w, sc, bi, dim, group_size, bits, out + static_cast<size_t>(i) * dim);
  }
}

} // namespace decode

namespace {

using decode::kBlock;
constexpr int kLanes = 16; // partial sums and maxima of the softmax, combined in one order

// The mask over keys [from, valid) of row (b, h, m)'s scores s.
void apply_mask(const AttnProblem& p, int b, int h, int m, int from, int valid, float* s) {
  int64_t base = b * p.mask_strides[0] + h * p.mask_strides[1] + m * p.mask_strides[2];
  int64_t st = p.mask_strides[3];
  if (p.mask_kind == MaskKind::boolean) {
    const bool* keep = static_cast<const bool*>(p.mask) + base;
    for (int t = from; t < valid; ++t) {
      if (!keep[t * st]) {
        s[t] = std::numeric_limits<float>::lowest(); // MLX: finfo(float32).min
      }
    }
  } else if (p.mask_kind == MaskKind::additive) {
    const float* add = static_cast<const float*>(p.mask) + base;
    for (int t = from; t < valid; ++t) {
      s[t] += add[t * st];
    }
  }
}

// Where row (b, h, m)'s bool mask row starts, or null without a bool mask.
const bool* keep_row(const AttnProblem& p, int b, int h, int m) {
  if (p.mask_kind != MaskKind::boolean) {
    return nullptr;
  }
  return static_cast<const bool*>(p.mask) + b * p.mask_strides[0] + h * p.mask_strides[1] +
         m * p.mask_strides[2];
}

// The first key a bool mask row keeps, or 0 when it keeps none before `valid` (then, as
// MLX, the softmax of equal minima over them all) or there is no bool mask. A batch
// cache's left padding is a run of excluded keys at the front of every decode row, as
// long as the batch's longest row is longer than this one: contiguous rows are scanned
// eight keys at a time.
int first_kept(const AttnProblem& p, const bool* keep, int valid) {
  if (keep == nullptr) {
    return 0;
  }
  const int64_t st = p.mask_strides[3];
  int first = 0;
  if (st == 1) {
    uint64_t word = 0;
    while (first + 8 <= valid && (std::memcpy(&word, keep + first, 8), word == 0)) {
      first += 8;
    }
  }
  while (first < valid && !keep[first * st]) {
    ++first;
  }
  return first == valid ? 0 : first;
}

// Lane-wise partial maxima and sums, combined in lane order: lane i takes positions
// i, i + 16, ... On x86-64 whole blocks of 16 run as four SSE vectors (the baseline
// instruction set: no dispatch): max_ps(s, lane) is std::max(lane, s), NaN and signed
// zeros included, and each lane adds its positions in order, so the bits are the plain
// loops'. Those (indexed t % 16) compiled to a scalar load, compare and store a position:
// ~13% of an 8-query call's time, and of a decode step's attention at long contexts.
// lanes[i] = step(s[t + i], lanes[i]) for each whole block of 16 positions, in order.
#if defined(__SSE2__)
template <class Step>
void fold_lanes(const float* s, int whole, float* lanes, Step step) {
  __m128 v[kLanes / 4];
  for (int c = 0; c < kLanes / 4; ++c) {
    v[c] = _mm_loadu_ps(lanes + 4 * c);
  }
  for (int t = 0; t < whole; t += kLanes) {
    for (int c = 0; c < kLanes / 4; ++c) {
      v[c] = step(_mm_loadu_ps(s + t + 4 * c), v[c]);
    }
  }
  for (int c = 0; c < kLanes / 4; ++c) {
    _mm_storeu_ps(lanes + 4 * c, v[c]);
  }
}

void lane_max(const float* s, int whole, float* lanes) {
  fold_lanes(s, whole, lanes, [](__m128 x, __m128 lane) { return _mm_max_ps(x, lane); });
}

void lane_sum(const float* s, int whole, float* lanes) {
  fold_lanes(s, whole, lanes, [](__m128 x, __m128 lane) { return _mm_add_ps(lane, x); });
}
#else
template <class Step>
void fold_lanes(const float* s, int whole, float* lanes, Step step) {
  for (int t = 0; t < whole; t += kLanes) {
    for (int i = 0; i < kLanes; ++i) {
      lanes[i] = step(s[t + i], lanes[i]);
    }
  }
}

void lane_max(const float* s, int whole, float* lanes) {
  fold_lanes(s, whole, lanes, [](float x, float lane) { return std::max(lane, x); });
}

void lane_sum(const float* s, int whole, float* lanes) {
  fold_lanes(s, whole, lanes, [](float x, float lane) { return lane + x; });
}
#endif

void softmax(float* s, int T) {
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, -std::numeric_limits<float>::infinity());
  const int whole = T / kLanes * kLanes;
  lane_max(s, whole, lanes);
  for (int t = whole; t < T; ++t) {
    lanes[t - whole] = std::max(lanes[t - whole], s[t]);
  }
  float top = lanes[0];
  for (int i = 1; i < kLanes; ++i) {
    top = std::max(top, lanes[i]);
  }
  for (int t = 0; t < T; ++t) {
    s[t] -= top;
  }
  exp_inplace(s, static_cast<size_t>(T));
  std::fill(lanes, lanes + kLanes, 0.0f);
  lane_sum(s, whole, lanes);
  for (int t = whole; t < T; ++t) {
    lanes[t - whole] += s[t];
  }
  float sum = 0.0f;
  for (float x : lanes) {
    sum += x;
  }
  float inv = 1.0f / sum;
  for (int t = 0; t < T; ++t) {
    s[t] *= inv;
  }
}

using Kernels = decode::Steps;

Kernels kernels() {
#if defined(__x86_64__)
  const char* name = isa();
  if (std::strcmp(name, "avx512") == 0) {
    return decode::steps_avx512();
  }
  if (std::strcmp(name, "avx2") == 0) {
    return decode::steps_avx2();
  }
#endif
  return decode::steps_scalar();
}

// Positions of K or V per tile: every block of query rows passes over a tile before the
// next one is read, so K and V cross the memory bus once per (sequence, KV head) however
// many rows share them (G query heads x M positions: 12 for a 4-token chunk of the
// bundled model, 3 blocks of kBlock) and the later blocks read the tile from L1 (64 rows
// of 64 floats: 16 KB). A quantized tile is unpacked into a buffer this long.
constexpr int kPositions = 64;

// One (sequence b, KV head kh): its G query heads x M positions, rows r = g * M + m (the
// output's order), in blocks of kBlock rows per pass over a tile of K or V. Three steps:
// the scores of a range of positions, the softmax of a range of rows, P.V for a range of
// output columns; each element's arithmetic is the same whichever ranges a call covers,
// so one thread may run a unit whole (`attend`) or threads may share its steps
// (`attend_shared`) with the same bits.
//
// A batch cache's left padding: the keys before a row's first kept one are left out of
// the softmax (they would add exact zeros), so its 16 lanes count from that key and the
// row's sums run as they do for the sequence alone: bit for bit, whatever the padding
// (rows join, leave and are moved right in a batch). Keys before every row's first kept
// one (`lo`) are not read at all: their scores would be overwritten with zeros, and P.V
// would add exact zeros for them in position order (fma(+0, v, acc) is acc), so skipping
// them keeps the bits, and a short row in a batch with a long one pays for its own
// length, not the longest row's.
struct Unit {
  const AttnProblem* p;
  Kernels kern;
  int b, kh, G, R;
  float* qs; // R x D: the rows' queries, scaled
  float* s; // R x T: scores, then probabilities
  int* spans; // per row: its first kept key and its valid keys
  int lo; // the first key any row keeps

  // Floats of scratch a unit needs for qs and s.
  static size_t floats(const AttnProblem& p) {
    const size_t R = static_cast<size_t>(p.Hq / p.Hkv) * p.M;
    return R * (p.D + p.T);
  }

  void prepare(float* scratch, int* span_scratch) {
    const AttnProblem& q = *p;
    qs = scratch;
    s = qs + static_cast<size_t>(R) * q.D;
    spans = span_scratch;
    lo = q.T;
    const bool* last_keep = nullptr; // rows sharing a mask row (heads broadcast) scan it once
    int last_valid = -1, last_first = 0;
    for (int r = 0; r < R; ++r) {
      const int m = r % q.M;
      const int h = kh * G + r / q.M;
      const float* qr = q.q + b * q.q_strides[0] + h * q.q_strides[1] + m * q.q_strides[2];
      for (int d = 0; d < q.D; ++d) {
        qs[r * q.D + d] = qr[d] * q.scale;
      }
      // Causally excluded keys get exactly 0 (as exp of the float minimum minus the max
      // would), so the softmax leaves them out and P.V adds exact zeros for them.
      const int valid = q.causal ? std::clamp(q.T - q.M + m + 1, 0, q.T) : q.T;
      const bool* keep = keep_row(q, b, h, m);
      int first = 0;
      if (valid > 0 && keep != nullptr) {
        if (keep != last_keep || valid != last_valid) {
          last_keep = keep;
          last_valid = valid;
          last_first = first_kept(q, keep, valid);
        }
        first = last_first;
      }
      spans[2 * r] = first;
      spans[2 * r + 1] = valid;
      lo = std::min(lo, first);
    }
  }

  // Tiles are kPositions long from lo; tile i covers [lo + i * kPositions, ...).
  int tiles() const { return (p->T - lo + kPositions - 1) / kPositions; }

  // Positions [t0, t0 + n) of K or V and their stride: in place in the cache, or unpacked
  // into `rows` (kPositions x dim floats) from a quantized one.
  const float* tile(bool keys, int t0, int n, float* rows, int64_t& stride) const {
    const AttnProblem& q = *p;
    const int64_t* strides = keys ? q.k_strides : q.v_strides;
    if (q.bits == 0) {
      const float* base = (keys ? q.k : q.v) + b * strides[0] + kh * strides[1];
      stride = strides[2];
      return base + t0 * strides[2];
    }
    const int dim = keys ? q.D : q.Dv;
    decode::dequant_rows(keys ? q.kq : q.vq, kern.dequant, q.group_size, q.bits, b, kh, t0, n,
                         dim, rows);
    stride = dim;
    return rows;
  }

  void score(int tile_begin, int tile_end, float* rows) const {
    const AttnProblem& q = *p;
    for (int i = tile_begin; i < tile_end; ++i) {
      const int t0 = lo + i * kPositions;
      const int n = std::min(kPositions, q.T - t0);
      int64_t stride = 0;
      const float* keys = tile(true, t0, n, rows, stride);
      for (int r = 0; r < R; r += kBlock) {
        kern.scores(qs + r * q.D, std::min(kBlock, R - r), q.D, keys, stride, n,
                    s + static_cast<size_t>(r) * q.T + t0, q.T);
      }
    }
  }

  void normalize(int r_begin, int r_end) const {
    const AttnProblem& q = *p;
    for (int r = r_begin; r < r_end; ++r) {
      const int m = r % q.M;
      float* row = s + static_cast<size_t>(r) * q.T;
      const int first = spans[2 * r], valid = spans[2 * r + 1];
      if (valid == 0) { // sees no key: MLX's softmax of equal minima, uniform over all T
        std::fill(row, row + q.T, 1.0f / static_cast<float>(q.T));
        continue;
      }
      apply_mask(q, b, kh * G + r / q.M, m, first, valid, row);
      softmax(row + first, valid - first);
      std::fill(row + lo, row + first, 0.0f);
      std::fill(row + valid, row + q.T, 0.0f);
    }
  }

  // Output columns [d0, d1). Sums tile by tile in position order: each output element's
  // additions run as one pass over all positions would run them (the partial sums are
  // stored and reloaded).
  void weigh(int d0, int d1, float* rows) const {
    const AttnProblem& q = *p;
    float* out = q.out + (static_cast<size_t>(b) * q.Hq + kh * G) * q.M * q.Dv + d0;
    for (int i = 0; i < tiles(); ++i) {
      const int t0 = lo + i * kPositions;
      const int n = std::min(kPositions, q.T - t0);
      int64_t stride = 0;
      const float* values = tile(false, t0, n, rows, stride) + d0;
      for (int r = 0; r < R; r += kBlock) {
        kern.pv(s + static_cast<size_t>(r) * q.T + t0, q.T, std::min(kBlock, R - r), n, values,
                stride, d1 - d0, out + static_cast<size_t>(r) * q.Dv, q.Dv, t0 > lo);
      }
    }
  }
};

Unit make_unit(const AttnProblem& p, const Kernels& kern, int u) {
  const int G = p.Hq / p.Hkv;
  return Unit{&p, kern, u / p.Hkv, u % p.Hkv, G, G * p.M, nullptr, nullptr, nullptr, 0};
}

// A quantized tile's unpacked rows.
size_t tile_floats(const AttnProblem& p) {
  return p.bits != 0 ? static_cast<size_t>(kPositions) * std::max(p.D, p.Dv) : 0;
}

void attend(const AttnProblem& p, const Kernels& kern, int u) {
  thread_local std::vector<float> scratch; // per thread: workers get their own
  thread_local std::vector<int> spans;
  Unit unit = make_unit(p, kern, u);
  scratch.resize(Unit::floats(p) + tile_floats(p));
  spans.resize(2 * static_cast<size_t>(unit.R));
  unit.prepare(scratch.data(), spans.data());
  float* rows = scratch.data() + Unit::floats(p);
  unit.score(0, unit.tiles(), rows);
  unit.normalize(0, unit.R);
  unit.weigh(0, p.Dv, rows);
}

// Fewer units than threads can share evenly (the bundled model's one sequence has 3 KV
// heads for 2 threads: one thread did two, the other one, then waited): the threads share
// each step of every unit instead, positions for the scores, rows for the softmax, units
// and then columns for P.V, with the same bits (see Unit). A one-row step at a 4k
// context: 27.2 against 30.7 ms (docs/benchmarks.md, round 21). Float K/V only: a
// quantized tile would be unpacked once per column range.
void attend_shared(const AttnProblem& p, const Kernels& kern, int units, int n_threads) {
  thread_local std::vector<float> scratch; // the calling thread's; workers write into it
  thread_local std::vector<int> spans;
  thread_local std::vector<Unit> kept;
  // A lambda names a thread_local as the running thread's own: the workers reach the
  // calling thread's units through this reference.
  std::vector<Unit>& all = kept;
  const size_t per_unit = Unit::floats(p);
  all.clear();
  for (int u = 0; u < units; ++u) {
    all.push_back(make_unit(p, kern, u));
  }
  const int R = all[0].R;
  scratch.resize(per_unit * units);
  spans.resize(2 * static_cast<size_t>(R) * units);
  for (int u = 0; u < units; ++u) {
    all[u].prepare(scratch.data() + per_unit * u, spans.data() + 2 * static_cast<size_t>(R) * u);
  }
  ThreadPool& pool = shared_pool();
  const int parts = 2 * n_threads; // position ranges per unit: a late worker costs one
  pool.run(n_threads, units * parts, [&](int c) {
    const Unit& unit = all[c / parts];
    const int part = c % parts, n = unit.tiles();
    unit.score(n * part / parts, n * (part + 1) / parts, nullptr);
  });
  pool.run(n_threads, units * R, [&](int c) { all[c / R].normalize(c % R, c % R + 1); });
  // P.V: column ranges of a unit read every V row in part, which costs more than they
  // save (each thread's prefetches fetch the other's columns too), so whole units go
  // round the threads first and only the ones left over are split by columns.
  const int whole = units / n_threads * n_threads;
  const int width = (p.Dv + 16 * n_threads - 1) / (16 * n_threads) * 16;
  pool.run(n_threads, whole + (units - whole) * n_threads, [&](int c) {
    if (c < whole) {
      all[c].weigh(0, p.Dv, nullptr);
      return;
    }
    const int d0 = std::min(p.Dv, (c - whole) % n_threads * width);
    all[whole + (c - whole) / n_threads].weigh(d0, std::min(p.Dv, d0 + width), nullptr);
  });
}

// Threads share a unit's steps when its positions are many and the units split unevenly
// (more than a tenth of the threads' time idle), K and V are float, and each thread's
// share of a position range is at least this many positions.
constexpr int kSharedMinPositions = 256;

bool share_units(const AttnProblem& p, int units, int n_threads) {
  const int rounds = (units + n_threads - 1) / n_threads;
  const bool uneven = 10 * rounds * n_threads > 11 * units;
  return p.bits == 0 && uneven && p.T >= 2 * n_threads * kSharedMinPositions;
}

} // namespace

decode::DequantFn decode::dequant_for_isa() {
  return kernels().dequant;
}

void sdpa_decode(const AttnProblem& p) {
  const Kernels kern = kernels(); // one instruction set for the whole call
  int units = p.B * p.Hkv;
  auto run = [&](int u0, int u1) {
    for (int u = u0; u < u1; ++u) {
      attend(p, kern, u);
    }
  };
  // The matmul's rule (qmm_kernel.cpp): waking a worker costs more than small work saves.
  // Work in its units: an FMA per query head, and loading a K or V element ~2 FMAs (like
  // unpacking a weight). The threshold is twice the matmul's (1 << 22 by default).
  long work = static_cast<long>(p.B) * p.T * (p.D + p.Dv) * (p.Hq * p.M + 2 * p.Hkv);
  int n_threads = work < 2 * parallel_min() ? 1 : threads();
  if (n_threads > 1 && share_units(p, units, n_threads)) {
    attend_shared(p, kern, units, n_threads);
    return;
  }
  n_threads = std::min(n_threads, units);
  if (n_threads <= 1) {
    run(0, units);
    return;
  }
  // About 4 chunks per thread, so a late worker costs one chunk.
  int per = (units + 4 * n_threads - 1) / (4 * n_threads);
  int chunks = (units + per - 1) / per;
  shared_pool().run(n_threads, chunks,
                    [&](int c) { run(c * per, std::min(units, (c + 1) * per)); });
}

namespace {

void softmax_row(const SoftmaxProblem& p, int64_t i) {
  float* s = p.s + i * p.L;
  const int m = static_cast<int>(i % p.M);
  // Causally excluded keys get exactly 0 either way (exp of the float minimum minus the
  // max underflows), so they are left out of the pass instead of masked.
  int valid = p.causal ? std::max(0, std::min(p.L, p.L - p.M + m + 1)) : p.L;
  if (p.scores != p.s) {
    std::copy(p.scores + i * p.L, p.scores + i * p.L + valid, s);
  }
  if (p.mask != nullptr) {
    int64_t b = p.mask_batches == 1 ? 0 : i / p.rows_per_batch;
    const bool* keep = p.mask + (b * p.M + m) * static_cast<int64_t>(p.L);
    bool any = false;
    for (int t = 0; t < valid; ++t) {
      any = any || keep[t];
    }
    if (!any || valid == 0) { // every key excluded: MLX's softmax of equal minima: uniform
      std::fill(s, s + p.L, 1.0f / static_cast<float>(p.L));
      return;
    }
    for (int t = 0; t < valid; ++t) {
      if (!keep[t]) {
        s[t] = std::numeric_limits<float>::lowest();
      }
    }
  }
  softmax(s, valid);
  std::fill(s + valid, s + p.L, 0.0f);
}

} // namespace

void softmax_prefill(const SoftmaxProblem& p) {
  long work = static_cast<long>(p.rows) * p.L;
  int n_threads = work < (1L << 15) ? 1 : threads();
  if (n_threads <= 1) {
    for (int64_t i = 0; i < p.rows; ++i) {
      softmax_row(p, i);
    }
    return;
  }
  int64_t per = std::max<int64_t>(1, p.rows / (8 * n_threads));
  int chunks = static_cast<int>((p.rows + per - 1) / per);
  shared_pool().run(n_threads, chunks, [&](int c) {
    int64_t end = std::min(p.rows, (c + 1) * per);
    for (int64_t i = c * per; i < end; ++i) {
      softmax_row(p, i);
    }
  });
}

} // namespace vllm_mlx_kernels
