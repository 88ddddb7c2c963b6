// Prefill attention on the CPU, fused and tiled (flash-attention style): one unit of work
// is (sequence b, KV head, block of kQ queries) with the G query heads sharing that KV
// head (or one of them, when there are too few units for the threads); it walks the keys
// in blocks of kK, and per block and head
//   1. s[j][i] = (q[i] * scale) . k[j]          (q scaled first, as MLX's fallback does)
//   2. excluded keys (after the query's causal limit, or false in the bool mask) -> -inf
//   3. online softmax: m[i] = max(m[i], max_j s[j][i]); p = exp(s - m) with MLX's exp
//      (exp_inplace); alpha = exp(m_old - m); l = l * alpha + sum_j p[j][i]
//   4. o[i] = o[i] * alpha + sum_j p[j][i] v[j]
// and at the end out[i] = o[i] * (1 / l[i]). The (heads x queries x keys) scores never
// exist in memory: a block's scores (kK x kQ floats, 16 KB) stay in L1. Key blocks no
// query of the unit sees (after the causal diagonal, or all false in the mask) are never
// computed.
//
// Layout: the queries are the vector lanes. q is packed transposed (qt[d][i]) once per
// unit, the block's scores are s[key][query], the output accumulates transposed
// (ot[c][i]); K and V are read in place, one element broadcast at a time. So the softmax's
// max and sums are lane-wise (vertical) operations, and no K block is ever transposed.
//
// A query that sees no key at all (a left-padded sequence's padding rows, or a causal
// query before the first key) gets what MLX's fallback gives it: the masked scores are
// all finfo.min, so the softmax is uniform and the output is the mean of V over every key.
//
// Each output element's operations depend on its query's position in the sequence, D, Dv
// and the key count, never on the batch, the split over threads or the thread; the sums
// run in another order than BLAS's, so results match MLX's to rounding, not bit for bit.
//
// This file: the portable steps and the driver (units, key blocks, masks, threads); the
// AVX2 and AVX-512 steps are in attn_prefill_avx2.cpp and attn_prefill_avx512.cpp
// (attn_prefill_internal.h).
#include <algorithm>
#include <cstring>
#include <vector>

#include "act_kernel.h"
#include "attn_kernel.h"
#include "attn_prefill_internal.h"
#include "qmm_kernel.h"
#include "thread_pool.h"

namespace vllm_mlx_kernels {

using namespace prefill;

namespace {

// --- portable: plain loops over the kQ lanes, which the compiler vectorizes (NEON on
// arm64, SSE2 on a baseline x86-64) without reordering any lane's sums.

void qk_portable(const float* qt, int D, const float* k, int64_t kst, int nk, const float* bias,
                 float* s) {
  for (int j = 0; j < nk; ++j) {
    float* sj = s + j * kQ;
    if (bias != nullptr) {
      std::copy(bias + j * kQ, bias + (j + 1) * kQ, sj);
    } else {
      std::fill(sj, sj + kQ, 0.0f);
    }
    const float* kj = k + j * kst;
    for (int d = 0; d < D; ++d) {
      const float kd = kj[d];
      const float* qd = qt + d * kQ;
      for (int i = 0; i < kQ; ++i) {
        sj[i] += kd * qd[i];
      }
    }
  }
}

// The lane-wise steps around the exp, shared by every instruction set (they are a small
// part of the work: one pass over the block's scores each).
void online_portable(float* s, int nk, float* m, float* l, float* alpha) {
  float shift[kQ];
  for (int i = 0; i < kQ; ++i) {
    shift[i] = m[i];
  }
  for (int j = 0; j < nk; ++j) {
    for (int i = 0; i < kQ; ++i) {
      shift[i] = std::max(shift[i], s[j * kQ + i]);
    }
  }
  for (int i = 0; i < kQ; ++i) {
    float top = shift[i];
    shift[i] = top == kNegInf ? 0.0f : top; // nothing seen yet: p = exp(-inf) = 0
    alpha[i] = m[i] - shift[i];
    m[i] = top;
  }
  for (int j = 0; j < nk; ++j) {
    for (int i = 0; i < kQ; ++i) {
      s[j * kQ + i] -= shift[i];
    }
  }
  exp_inplace(s, static_cast<size_t>(nk) * kQ);
  exp_inplace(alpha, kQ);
  float sum[kQ] = {};
  for (int j = 0; j < nk; ++j) {
    for (int i = 0; i < kQ; ++i) {
      sum[i] += s[j * kQ + i];
    }
  }
  for (int i = 0; i < kQ; ++i) {
    l[i] = l[i] * alpha[i] + sum[i];
  }
}

void pv_portable(const float* p, int nk, const float* v, int64_t vst, int Dv,
                 const float* alpha, float* ot, float* acc) {
  std::fill(acc, acc + static_cast<size_t>(Dv) * kQ, 0.0f);
  for (int j = 0; j < nk; ++j) {
    const float* vj = v + j * vst;
    const float* pj = p + j * kQ;
    for (int c = 0; c < Dv; ++c) {
      const float vc = vj[c];
      float* ac = acc + c * kQ;
      for (int i = 0; i < kQ; ++i) {
        ac[i] += vc * pj[i];
      }
    }
  }
  for (int c = 0; c < Dv; ++c) {
    for (int i = 0; i < kQ; ++i) {
      ot[c * kQ + i] = ot[c * kQ + i] * alpha[i] + acc[c * kQ + i];
    }
  }
}

Ops ops() {
#if defined(__x86_64__)
  const char* name = isa();
  if (std::strcmp(name, "avx512") == 0) {
    return ops_avx512();
  }
  if (std::strcmp(name, "avx2") == 0) {
    return ops_avx2();
  }
#endif
  return {qk_portable, online_portable, pv_portable};
}

// What a key block is for the unit's queries.
enum class Block { skip, all, bias };

// The last key (exclusive) that query position `qpos` may see causally.
inline int causal_limit(const PrefillProblem& p, int qpos) {
  return p.L - p.M + qpos + 1;
}

// Whether the block [kb, kb + nk) is seen by none, all or some of queries [q0, q0 + nq);
// for some, bias (nk x kQ) gets 0 where seen and -inf where not (lanes past nq: 0).
Block classify(const PrefillProblem& p, int b, int q0, int nq, int kb, int nk, float* bias) {
  const bool* rows = nullptr;
  if (p.mask != nullptr) {
    int mb = p.mask_batches == 1 ? 0 : b;
    rows = p.mask + (static_cast<int64_t>(mb) * p.M + q0) * p.L + kb;
  }
  // Per query, the keys of the block it may see at most (causal), and whether the mask
  // hides any of those / shows any.
  bool any_seen = false, any_hidden = false;
  for (int i = 0; i < nq; ++i) {
    int lim = p.causal ? std::clamp(causal_limit(p, q0 + i) - kb, 0, nk) : nk;
    any_hidden = any_hidden || lim < nk;
    if (rows == nullptr) {
      any_seen = any_seen || lim > 0;
      continue;
    }
    const bool* row = rows + static_cast<int64_t>(i) * p.L;
    int shown = 0;
    for (int j = 0; j < lim; ++j) {
      shown += row[j] ? 1 : 0;
    }
    any_seen = any_seen || shown > 0;
    any_hidden = any_hidden || shown < lim;
  }
  if (!any_seen) {
    return Block::skip;
  }
  if (!any_hidden) {
    return Block::all;
  }
  for (int j = 0; j < nk; ++j) {
    std::fill(bias + j * kQ + nq, bias + (j + 1) * kQ, 0.0f);
  }
  for (int i = 0; i < nq; ++i) {
    int lim = p.causal ? std::clamp(causal_limit(p, q0 + i) - kb, 0, nk) : nk;
    const bool* row = rows == nullptr ? nullptr : rows + static_cast<int64_t>(i) * p.L;
    for (int j = 0; j < nk; ++j) {
      bool seen = j < lim && (row == nullptr || row[j]);
      bias[j * kQ + i] = seen ? 0.0f : kNegInf;
    }
  }
  return Block::bias;
}

struct Scratch {
  std::vector<float> qt, ot, m, l, s, bias, alpha, acc;
};

// One unit: sequence b, queries [q0, q0 + kQ), the G query heads from the g0-th of KV
// head kh's group (the whole group, or one head when there are few units to share out).
void attend_block(const PrefillProblem& p, const Ops& op, int b, int kh, int g0, int G,
                  int q0, Scratch& w) {
  const int D = p.D, Dv = p.Dv;
  const int h0 = kh * (p.Hq / p.Hkv) + g0; // the unit's first query head
  const int nq = std::min(kQ, p.M - q0);
  w.qt.assign(static_cast<size_t>(G) * D * kQ, 0.0f);
  w.ot.assign(static_cast<size_t>(G) * Dv * kQ, 0.0f);
  w.m.assign(static_cast<size_t>(G) * kQ, kNegInf);
  w.l.assign(static_cast<size_t>(G) * kQ, 0.0f);
  w.s.resize(static_cast<size_t>(kK) * kQ);
  w.bias.resize(static_cast<size_t>(kK) * kQ);
  w.alpha.resize(kQ);
  w.acc.resize(static_cast<size_t>(Dv) * kQ);
  for (int g = 0; g < G; ++g) {
    const float* q = p.q + b * p.q_strides[0] + (h0 + g) * p.q_strides[1];
    float* qt = w.qt.data() + static_cast<size_t>(g) * D * kQ;
    for (int i = 0; i < nq; ++i) {
      const float* qr = q + (q0 + i) * p.q_strides[2];
      for (int d = 0; d < D; ++d) {
        qt[d * kQ + i] = qr[d] * p.scale;
      }
    }
  }
  const float* k = p.k + b * p.k_strides[0] + kh * p.k_strides[1];
  const float* v = p.v + b * p.v_strides[0] + kh * p.v_strides[1];
  const int64_t kst = p.k_strides[2], vst = p.v_strides[2];
  // Causally, no query of the unit sees a key past its last query's limit.
  const int kend = p.causal ? std::clamp(causal_limit(p, q0 + nq - 1), 0, p.L) : p.L;
  for (int kb = 0; kb < kend; kb += kK) {
    const int nk = std::min(kK, kend - kb);
    Block kind = classify(p, b, q0, nq, kb, nk, w.bias.data());
    if (kind == Block::skip) {
      continue;
    }
    const float* bias = kind == Block::bias ? w.bias.data() : nullptr;
    for (int g = 0; g < G; ++g) {
      float* m = w.m.data() + g * kQ;
      float* l = w.l.data() + g * kQ;
      op.qk(w.qt.data() + static_cast<size_t>(g) * D * kQ, D, k + kb * kst, kst, nk, bias,
            w.s.data());
      op.online(w.s.data(), nk, m, l, w.alpha.data());
      op.pv(w.s.data(), nk, v + kb * vst, vst, Dv, w.alpha.data(),
            w.ot.data() + static_cast<size_t>(g) * Dv * kQ, w.acc.data());
    }
  }
  // A query that saw no key: MLX's uniform softmax over every key, the mean of V.
  std::vector<float> mean;
  for (int g = 0; g < G; ++g) {
    const float* m = w.m.data() + g * kQ;
    const float* l = w.l.data() + g * kQ;
    const float* ot = w.ot.data() + static_cast<size_t>(g) * Dv * kQ;
    float* out = p.out + ((static_cast<int64_t>(b) * p.Hq + h0 + g) * p.M + q0) * Dv;
    for (int i = 0; i < nq; ++i) {
      float* o = out + static_cast<int64_t>(i) * Dv;
      if (m[i] == kNegInf) {
        if (mean.empty()) {
          mean.assign(Dv, 0.0f);
          const float uniform = 1.0f / static_cast<float>(p.L);
          for (int t = 0; t < p.L; ++t) {
            for (int c = 0; c < Dv; ++c) {
              mean[c] += uniform * v[t * vst + c];
            }
          }
        }
        std::copy(mean.begin(), mean.end(), o);
        continue;
      }
      const float inv = 1.0f / l[i];
      for (int c = 0; c < Dv; ++c) {
        o[c] = ot[c * kQ + i] * inv;
      }
    }
  }
}

} // namespace

void sdpa_prefill(const PrefillProblem& p) {
  const Ops op = ops(); // one instruction set for the whole call
  const int G = p.Hq / p.Hkv;
  const int blocks = (p.M + kQ - 1) / kQ;
  // The matmul's rule (qmm_kernel.cpp): small work stays on the calling thread (at twice
  // its threshold, the 1 << 22 this was measured with).
  long work = static_cast<long>(p.B) * p.Hq * p.M * p.L * (p.D + p.Dv);
  int n_threads = work < 2 * parallel_min() ? 1 : threads();
  // A unit holds a KV head's G query heads, which share its K and V reads; with fewer
  // units than ~4 a thread (one short sequence: 3 units for the bundled model), each
  // query head is a unit instead, so that the threads' shares come out even.
  const int heads = n_threads > 1 && p.B * p.Hkv * blocks < 4 * n_threads ? 1 : G;
  const int per_block = p.B * p.Hq / heads;
  const int units = blocks * per_block;
  // Unit u: the query blocks from the last down, so that causally the longest go first
  // and a thread that finishes early picks up the short ones.
  auto run = [&](int u) {
    thread_local Scratch scratch; // the thread's own (a worker names its own copy)
    int block = blocks - 1 - u / per_block, rest = u % per_block;
    int b = rest / (p.Hq / heads), h = rest % (p.Hq / heads) * heads; // first query head
    attend_block(p, op, b, h / G, h % G, heads, block * kQ, scratch);
  };
  n_threads = std::min(n_threads, units);
  if (n_threads <= 1) {
    for (int u = 0; u < units; ++u) {
      run(u);
    }
    return;
  }
  shared_pool().run(n_threads, units, run);
}

} // namespace vllm_mlx_kernels
