#include "thread_pool.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace vllm_mlx_kernels {

namespace {

// How long a worker spins for the next job before sleeping (set_worker_spin_us). The
// matmuls of a decode step come tens of microseconds apart: spinning through those gaps
// saves each one a futex wake, but the spinning core is the one the Python thread builds
// the next step's graph on. Which wins depends on the machine (on an AMD EPYC a 60 us
// spin was slower, on an Intel Xeon 30 us was faster): the loader measures both
// (models/cpu/pool_policy.py). 3 us by default: claimed chunks make a slow wake cheap.
std::atomic<int> g_worker_spin_us{3};
// The first part of a worker's spin runs on pause instructions; past it the worker yields
// between checks, so a longer spin hands the core to any thread that wants it (another
// process's, the Python thread). Two daemons decoding side by side on two cores lost 13%
// of their throughput to a 30 us pausing spin, 5-13% to this one (docs/benchmarks.md,
// round 20); one daemon alone gains as much from it.
constexpr auto kPausingSpin = std::chrono::microseconds(3);
// The caller spins this long for the workers' last chunks (they are running, so the wait
// is about one chunk) before sleeping.
constexpr auto kCallerSpin = std::chrono::microseconds(200);

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// yielding: give the core to any other runnable thread between checks (sched_yield), so
// that a spin costs nothing where the cores are shared; otherwise a pause instruction.
template <class Done>
bool spin_until(Done done, std::chrono::microseconds limit, bool yielding = false) {
  auto until = std::chrono::steady_clock::now() + limit;
  for (int spins = 1;; ++spins) {
    if (done()) {
      return true;
    }
    if (yielding) {
      std::this_thread::yield();
    } else {
      relax();
    }
    if ((yielding || spins % 64 == 0) && std::chrono::steady_clock::now() > until) {
      return false;
    }
  }
}

} // namespace

void set_worker_spin_us(int us) {
  g_worker_spin_us = std::max(0, us);
}

int worker_spin_us() {
  return g_worker_spin_us;
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  wake_.fetch_add(1);
  wake_.notify_all();
  for (auto& t : workers_) {
    t.join();
  }
}

void ThreadPool::grow(int workers) {
  while (static_cast<int>(workers_.size()) < workers) {
    workers_.emplace_back([this] { work(); });
  }
}

// Claims chunks of job `generation` until none are left; false when that job is over.
bool ThreadPool::claim_and_run(uint32_t generation) {
  for (;;) {
    uint64_t v = claim_.load(std::memory_order_acquire);
    // Read before the compare-exchange: if it succeeds, the job was still this one.
    const auto* fn = job_.load(std::memory_order_relaxed);
    int chunks = chunks_.load(std::memory_order_relaxed);
    uint32_t index = static_cast<uint32_t>(v);
    if (static_cast<uint32_t>(v >> 32) != generation || index >= static_cast<uint32_t>(chunks)) {
      return false;
    }
    if (!claim_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) {
      continue;
    }
    (*fn)(static_cast<int>(index));
    if (done_.fetch_add(1) + 1 == static_cast<uint32_t>(chunks) &&
        caller_asleep_.load()) {
      done_.notify_one();
    }
  }
}

void ThreadPool::run(int threads, int chunks, const std::function<void(int)>& fn) {
  if (threads <= 1 || chunks <= 1) {
    for (int i = 0; i < chunks; ++i) {
      fn(i);
    }
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  grow(threads - 1);
  uint32_t generation = ++generation_;
  job_.store(&fn, std::memory_order_relaxed);
  chunks_.store(chunks, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  claim_.store(static_cast<uint64_t>(generation) << 32, std::memory_order_release);
  wake_.store(generation); // seq_cst with the load of sleepers_: a worker going to sleep
  if (sleepers_.load() > 0) { // either sees the new generation or is counted here
    wake_.notify_all();
  }
  claim_and_run(generation);
  auto total = static_cast<uint32_t>(chunks);
  auto finished = [&] { return done_.load(std::memory_order_acquire) == total; };
  if (!spin_until(finished, kCallerSpin)) {
    caller_asleep_.store(true);
    for (uint32_t d; (d = done_.load()) != total;) {
      done_.wait(d);
    }
    caller_asleep_.store(false);
  }
}

void ThreadPool::work() {
  uint32_t seen = 0;
  for (;;) {
    auto fresh = [&] { return wake_.load(std::memory_order_acquire) != seen; };
    const auto spin = std::chrono::microseconds(g_worker_spin_us.load());
    const auto pausing = std::min(spin, kPausingSpin);
    const bool woken =
        spin_until(fresh, pausing) || (spin > pausing && spin_until(fresh, spin - pausing, true));
    if (!woken) {
      sleepers_.fetch_add(1);
      wake_.wait(seen);
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) {
      return;
    }
    seen = wake_.load(std::memory_order_acquire);
    claim_and_run(seen);
  }
}

} // namespace vllm_mlx_kernels
