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
// A chunk of up to 32 queries (prefill pacing's pieces beside decoding streams) fills the
// lanes with several query heads' rows (Lanes), computes only the 16-64 lanes they take,
// and splits its keys into ranges folded at the end (sdpa_prefill).
//
// A query that sees no key at all (a left-padded sequence's padding rows, or a causal
// query before the first key) gets what MLX's fallback gives it: the masked scores are
// all finfo.min, so the softmax is uniform and the output is the mean of V over every key.
//
// Each output element's operations depend on its query's position in the sequence, D, Dv,
// the key count and the query count, never on the batch, the split over threads, the
// thread or the other rows sharing its lanes; the sums run in another order than BLAS's,
// so results match MLX's to rounding, not bit for bit.
//
// This file: the portable steps and the driver (units, key blocks, masks, threads); the
// AVX2 and AVX-512 steps are in attn_prefill_avx2.cpp and attn_prefill_avx512.cpp
// (attn_prefill_internal.h).
#include <algorithm>
#include <cstring>
#include <vector>

#include "act_kernel.h"
#include "attn_decode_internal.h"
#include "attn_kernel.h"
#include "attn_prefill_internal.h"
#include "qmm_kernel.h"
#include "thread_pool.h"

namespace vllm_mlx_kernels {

using namespace prefill;

namespace {

// Keys per range of a short chunk's split (sdpa_prefill): a multiple of kK.
constexpr int kSplitKeys = 256;

// --- portable: plain loops over the kQ lanes, which the compiler vectorizes (NEON on
// arm64, SSE2 on a baseline x86-64) without reordering any lane's sums.

void qk_portable(const float* qt, int W, int D, const float* k, int64_t kst, int nk,
                 const float* bias, float* s) {
  for (int j = 0; j < nk; ++j) {
    float* sj = s + j * W;
    if (bias != nullptr) {
      std::copy(bias + j * W, bias + (j + 1) * W, sj);
    } else {
      std::fill(sj, sj + W, 0.0f);
    }
    const float* kj = k + j * kst;
    for (int d = 0; d < D; ++d) {
      const float kd = kj[d];
      const float* qd = qt + d * W;
      for (int i = 0; i < W; ++i) {
        sj[i] += kd * qd[i];
      }
    }
  }
}

// The lane-wise steps around the exp, shared by every instruction set (they are a small
// part of the work: one pass over the block's scores each).
void online_portable(float* s, int W, int nk, float* m, float* l, float* alpha) {
  float shift[kQ];
  for (int i = 0; i < W; ++i) {
    shift[i] = m[i];
  }
  for (int j = 0; j < nk; ++j) {
    for (int i = 0; i < W; ++i) {
      shift[i] = std::max(shift[i], s[j * W + i]);
    }
  }
  for (int i = 0; i < W; ++i) {
    float top = shift[i];
    shift[i] = top == kNegInf ? 0.0f : top; // nothing seen yet: p = exp(-inf) = 0
    alpha[i] = m[i] - shift[i];
    m[i] = top;
  }
  for (int j = 0; j < nk; ++j) {
    for (int i = 0; i < W; ++i) {
      s[j * W + i] -= shift[i];
    }
  }
  exp_inplace(s, static_cast<size_t>(nk) * W);
  exp_inplace(alpha, W);
  float sum[kQ] = {};
  for (int j = 0; j < nk; ++j) {
    for (int i = 0; i < W; ++i) {
      sum[i] += s[j * W + i];
    }
  }
  for (int i = 0; i < W; ++i) {
    l[i] = l[i] * alpha[i] + sum[i];
  }
}

void pv_portable(const float* p, int W, int nk, const float* v, int64_t vst, int Dv,
                 const float* alpha, float* ot, float* acc) {
  std::fill(acc, acc + static_cast<size_t>(Dv) * W, 0.0f);
  for (int j = 0; j < nk; ++j) {
    const float* vj = v + j * vst;
    const float* pj = p + j * W;
    for (int c = 0; c < Dv; ++c) {
      const float vc = vj[c];
      float* ac = acc + c * W;
      for (int i = 0; i < W; ++i) {
        ac[i] += vc * pj[i];
      }
    }
  }
  for (int c = 0; c < Dv; ++c) {
    for (int i = 0; i < W; ++i) {
      ot[c * W + i] = ot[c * W + i] * alpha[i] + acc[c * W + i];
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
// for some, bias (nk x kQ) gets 0 where seen and -inf where not, for lanes i < nq.
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

// A unit's query heads share its lanes `packed` at a time: lane g * nq + i is query
// q0 + i of the group's g-th head. A short chunk (a paced prompt's few tokens beside
// decoding streams) then fills the lanes with its heads' rows instead of padding: a
// 4k-token cache's K and V are read once per KV head for the G x nq rows, and the work is
// their W = 16 * ceil(packed * nq / 16) lanes, not 64 per head.
struct Lanes {
  int nq, packed;
  int width(int heads) const { return (heads * nq + kLaneStep - 1) / kLaneStep * kLaneStep; }
};

// The bias of a group of `heads` heads (nk x W): each head's lanes get the queries' bias
// (base: nk x kQ, lanes < nq), the padding lanes 0.
void group_bias(const float* base, int nk, const Lanes& lanes, int heads, int W, float* bias) {
  for (int j = 0; j < nk; ++j) {
    float* row = bias + j * W;
    for (int g = 0; g < heads; ++g) {
      std::copy(base + j * kQ, base + j * kQ + lanes.nq, row + g * lanes.nq);
    }
    std::fill(row + heads * lanes.nq, row + W, 0.0f);
  }
}

struct Scratch {
  std::vector<float> qt, s, base, bias, alpha, acc;
  std::vector<float> keys, values; // a quantized cache's key block, dequantized
};

// One unit: sequence b, queries [q0, q0 + nq), the G query heads from the g0-th of KV
// head kh's group (the whole group, or one head when there are few units to share out),
// `packed` heads to a group of lanes.
struct Unit {
  const PrefillProblem* p;
  int b, kh, g0, G, q0, packed;

  int h0() const { return kh * (p->Hq / p->Hkv) + g0; } // the unit's first query head
  Lanes lanes() const { return Lanes{std::min(kQ, p->M - q0), packed}; }
  int groups() const { return (G + packed - 1) / packed; }
  int heads_of(int group) const { return std::min(packed, G - group * packed); }
  // Causally, no query of the unit sees a key past its last query's limit.
  int key_end() const {
    const int last = q0 + lanes().nq - 1;
    return p->causal ? std::clamp(causal_limit(*p, last), 0, p->L) : p->L;
  }
  // Floats of a unit's softmax state: per group, m and l (kQ each) and ot (Dv x kQ).
  size_t state_floats() const { return static_cast<size_t>(groups()) * kQ * (p->Dv + 2); }
};

// The running softmax state of a unit's groups, in `state` (Unit::state_floats()).
struct State {
  float *m, *l, *ot;
  State(const Unit& u, float* state)
      : m(state), l(state + u.groups() * kQ), ot(state + 2 * u.groups() * kQ) {}
};

// Keys [kb_begin, kb_end) of the unit, from a fresh state (m = -inf, l = 0, ot = 0).
void attend_keys(const Unit& u, const Ops& op, decode::DequantFn dequant, int kb_begin,
                 int kb_end, float* state, Scratch& w) {
  const PrefillProblem& p = *u.p;
  const int D = p.D, Dv = p.Dv, groups = u.groups();
  const Lanes lanes = u.lanes();
  const int nq = lanes.nq;
  State st(u, state);
  std::fill(st.m, st.m + groups * kQ, kNegInf);
  std::fill(st.l, st.l + groups * kQ, 0.0f);
  std::fill(st.ot, st.ot + static_cast<size_t>(groups) * Dv * kQ, 0.0f);
  w.qt.assign(static_cast<size_t>(groups) * D * kQ, 0.0f);
  w.s.resize(static_cast<size_t>(kK) * kQ);
  w.base.resize(static_cast<size_t>(kK) * kQ);
  w.bias.resize(static_cast<size_t>(kK) * kQ);
  w.alpha.resize(kQ);
  w.acc.resize(static_cast<size_t>(Dv) * kQ);
  for (int g = 0; g < u.G; ++g) {
    const int group = g / u.packed, lane0 = g % u.packed * nq;
    const int W = lanes.width(u.heads_of(group));
    const float* q = p.q + u.b * p.q_strides[0] + (u.h0() + g) * p.q_strides[1];
    float* qt = w.qt.data() + static_cast<size_t>(group) * D * kQ;
    for (int i = 0; i < nq; ++i) {
      const float* qr = q + (u.q0 + i) * p.q_strides[2];
      for (int d = 0; d < D; ++d) {
        qt[d * W + lane0 + i] = qr[d] * p.scale;
      }
    }
  }
  const bool quantized = p.bits != 0;
  if (quantized) {
    w.keys.resize(static_cast<size_t>(kK) * D);
    w.values.resize(static_cast<size_t>(kK) * Dv);
  }
  for (int kb = kb_begin; kb < kb_end; kb += kK) {
    const int nk = std::min(kK, kb_end - kb);
    Block kind = classify(p, u.b, u.q0, nq, kb, nk, w.base.data());
    if (kind == Block::skip) {
      continue;
    }
    // The block's K and V: in place, or a quantized cache's rows dequantized (the floats
    // MLX's dequantize gives, so the bits of the float kernel over the unpacked cache).
    const float *k = w.keys.data(), *v = w.values.data();
    int64_t kst = D, vst = Dv;
    if (quantized) {
      decode::dequant_rows(p.kq, dequant, p.group_size, p.bits, u.b, u.kh, kb, nk, D,
                           w.keys.data());
      decode::dequant_rows(p.vq, dequant, p.group_size, p.bits, u.b, u.kh, kb, nk, Dv,
                           w.values.data());
    } else {
      k = p.k + u.b * p.k_strides[0] + u.kh * p.k_strides[1] + kb * p.k_strides[2];
      v = p.v + u.b * p.v_strides[0] + u.kh * p.v_strides[1] + kb * p.v_strides[2];
      kst = p.k_strides[2];
      vst = p.v_strides[2];
    }
    for (int group = 0; group < groups; ++group) {
      const int W = lanes.width(u.heads_of(group));
      const float* bias = nullptr;
      if (kind == Block::bias) {
        group_bias(w.base.data(), nk, lanes, u.heads_of(group), W, w.bias.data());
        bias = w.bias.data();
      }
      op.qk(w.qt.data() + static_cast<size_t>(group) * D * kQ, W, D, k, kst, nk, bias,
            w.s.data());
      op.online(w.s.data(), W, nk, st.m + group * kQ, st.l + group * kQ, w.alpha.data());
      op.pv(w.s.data(), W, nk, v, vst, Dv, w.alpha.data(),
            st.ot + static_cast<size_t>(group) * Dv * kQ, w.acc.data());
    }
  }
}

// Folds the states of a unit's key ranges (`parts` of them, state_floats() apart, in key
// order) into the first: m the largest, l and ot each range's scaled by exp(m_part - m)
// (MLX's exp) and summed in key order. A lane no range saw keeps m = -inf.
void combine(const Unit& u, float* states, int parts) {
  const int groups = u.groups(), Dv = u.p->Dv;
  const size_t stride = u.state_floats();
  State first(u, states);
  float top[kQ];
  std::vector<float> scale(static_cast<size_t>(parts) * kQ);
  for (int group = 0; group < groups; ++group) {
    const int W = u.lanes().width(u.heads_of(group));
    std::fill(top, top + kQ, kNegInf);
    for (int part = 0; part < parts; ++part) {
      const float* mp = State(u, states + part * stride).m + group * kQ;
      for (int i = 0; i < W; ++i) {
        top[i] = std::max(top[i], mp[i]);
      }
    }
    for (int part = 0; part < parts; ++part) {
      const float* mp = State(u, states + part * stride).m + group * kQ;
      float* sc = scale.data() + part * kQ;
      for (int i = 0; i < W; ++i) { // a range that saw none of the lane's keys adds 0
        sc[i] = mp[i] == kNegInf ? kNegInf : mp[i] - top[i];
      }
    }
    exp_inplace(scale.data(), static_cast<size_t>(parts) * kQ);
    std::copy(top, top + W, first.m + group * kQ);
    float* l = first.l + group * kQ;
    float* ot = first.ot + static_cast<size_t>(group) * Dv * kQ;
    for (int i = 0; i < W; ++i) {
      l[i] *= scale[i];
    }
    for (int c = 0; c < Dv; ++c) {
      for (int i = 0; i < W; ++i) {
        ot[c * W + i] *= scale[i];
      }
    }
    for (int part = 1; part < parts; ++part) {
      State sp(u, states + part * stride);
      const float* sc = scale.data() + part * kQ;
      const float* lp = sp.l + group * kQ;
      const float* op = sp.ot + static_cast<size_t>(group) * Dv * kQ;
      for (int i = 0; i < W; ++i) {
        l[i] += lp[i] * sc[i];
      }
      for (int c = 0; c < Dv; ++c) {
        for (int i = 0; i < W; ++i) {
          ot[c * W + i] += op[c * W + i] * sc[i];
        }
      }
    }
  }
}

// The unit's output rows from its final state.
void finish(const Unit& u, decode::DequantFn dequant, float* state) {
  const PrefillProblem& p = *u.p;
  const int Dv = p.Dv;
  const Lanes lanes = u.lanes();
  const int nq = lanes.nq;
  State st(u, state);
  // A query that saw no key: MLX's uniform softmax over every key, the mean of V.
  std::vector<float> mean, row(p.bits != 0 ? Dv : 0);
  auto v_row = [&](int t) -> const float* {
    if (p.bits == 0) {
      return p.v + u.b * p.v_strides[0] + u.kh * p.v_strides[1] + t * p.v_strides[2];
    }
    decode::dequant_rows(p.vq, dequant, p.group_size, p.bits, u.b, u.kh, t, 1, Dv, row.data());
    return row.data();
  };
  for (int g = 0; g < u.G; ++g) {
    const int group = g / u.packed, lane0 = g % u.packed * nq;
    const int W = lanes.width(u.heads_of(group));
    const float* m = st.m + group * kQ + lane0;
    const float* l = st.l + group * kQ + lane0;
    const float* ot = st.ot + static_cast<size_t>(group) * Dv * kQ + lane0;
    float* out = p.out + ((static_cast<int64_t>(u.b) * p.Hq + u.h0() + g) * p.M + u.q0) * Dv;
    for (int i = 0; i < nq; ++i) {
      float* o = out + static_cast<int64_t>(i) * Dv;
      if (m[i] == kNegInf) {
        if (mean.empty()) {
          mean.assign(Dv, 0.0f);
          const float uniform = 1.0f / static_cast<float>(p.L);
          for (int t = 0; t < p.L; ++t) {
            const float* vt = v_row(t);
            for (int c = 0; c < Dv; ++c) {
              mean[c] += uniform * vt[c];
            }
          }
        }
        std::copy(mean.begin(), mean.end(), o);
        continue;
      }
      const float inv = 1.0f / l[i];
      for (int c = 0; c < Dv; ++c) {
        o[c] = ot[c * W + i] * inv;
      }
    }
  }
}

} // namespace

void sdpa_prefill(const PrefillProblem& p) {
  const Ops op = ops(); // one instruction set for the whole call
  const decode::DequantFn dequant = p.bits != 0 ? decode::dequant_for_isa() : nullptr;
  const int G = p.Hq / p.Hkv;
  const int blocks = (p.M + kQ - 1) / kQ;
  // The matmul's rule (qmm_kernel.cpp): small work stays on the calling thread (at twice
  // its threshold, the 1 << 22 this was measured with).
  long work = static_cast<long>(p.B) * p.Hq * p.M * p.L * (p.D + p.Dv);
  int n_threads = work < 2 * parallel_min() ? 1 : threads();
  // A unit holds a KV head's G query heads, which share its K and V reads. With fewer
  // units than ~4 a thread (one sequence's 512-token chunk: 3 units for the bundled
  // model), each query head is a unit instead, so that the threads' shares come out
  // even; but a chunk of up to 32 queries packs 2 or more heads into the lanes, so it
  // keeps them together and its keys are split into ranges instead (below).
  const bool short_chunk = 2 * p.M <= kQ; // 2 or more heads' rows fit the lanes
  const bool few_units = n_threads > 1 && p.B * p.Hkv * blocks < 4 * n_threads;
  const int heads = few_units && !short_chunk ? 1 : G;
  const int per_block = p.B * p.Hq / heads;
  // Heads whose rows share a unit's lanes: as many as fit when a block has fewer queries
  // than lanes (one block of M queries), else one.
  const int packed = std::clamp(kQ / std::min(kQ, p.M), 1, heads);
  const int units = blocks * per_block;
  // Unit u: the query blocks from the last down, so that causally the longest go first
  // and a thread that finishes early picks up the short ones.
  auto unit_of = [&](int u) {
    int block = blocks - 1 - u / per_block, rest = u % per_block;
    int b = rest / (p.Hq / heads), h = rest % (p.Hq / heads) * heads; // first query head
    return Unit{&p, b, h / G, h % G, heads, block * kQ, packed};
  };
  // A short chunk's units are few (one per KV head a sequence: 3 for the bundled model's
  // one sequence, on 2 threads one waits a third of the time) and long (every earlier
  // key): their keys go in ranges of kSplitKeys (the last one up to twice that), each
  // range's softmax state kept apart
  // and folded in key order at the end (flash-decoding). The ranges depend on the key
  // count alone, never on the threads, so the bits do not either.
  const int key_end = unit_of(0).key_end();
  const int parts = short_chunk ? std::max(1, key_end / kSplitKeys) : 1; // the last is longer
  if (parts == 1) {
    auto run = [&](int u) {
      thread_local Scratch scratch; // the thread's own (a worker names its own copy)
      thread_local std::vector<float> state;
      const Unit unit = unit_of(u);
      state.resize(unit.state_floats());
      attend_keys(unit, op, dequant, 0, unit.key_end(), state.data(), scratch);
      finish(unit, dequant, state.data());
    };
    n_threads = std::min(n_threads, units);
    if (n_threads <= 1) {
      for (int u = 0; u < units; ++u) {
        run(u);
      }
      return;
    }
    shared_pool().run(n_threads, units, run);
    return;
  }
  // One query block: every unit has the same queries, so the same key end.
  const size_t per_state = unit_of(0).state_floats();
  thread_local std::vector<float> states; // the calling thread's; workers write into it
  states.resize(per_state * units * parts);
  float* all_states = states.data(); // a lambda would name a worker's own thread_local
  auto range = [&](int item) {
    thread_local Scratch scratch;
    const int u = item / parts, part = item % parts;
    const int kb_end = part == parts - 1 ? key_end : (part + 1) * kSplitKeys;
    attend_keys(unit_of(u), op, dequant, part * kSplitKeys, kb_end,
                all_states + per_state * (static_cast<size_t>(u) * parts + part), scratch);
  };
  auto fold = [&](int u) {
    float* first = all_states + per_state * static_cast<size_t>(u) * parts;
    combine(unit_of(u), first, parts);
    finish(unit_of(u), dequant, first);
  };
  n_threads = std::min(n_threads, units * parts);
  if (n_threads <= 1) {
    for (int item = 0; item < units * parts; ++item) {
      range(item);
    }
    for (int u = 0; u < units; ++u) {
      fold(u);
    }
    return;
  }
  shared_pool().run(n_threads, units * parts, range);
  shared_pool().run(std::min(n_threads, units), units, fold);
}

} // namespace vllm_mlx_kernels
