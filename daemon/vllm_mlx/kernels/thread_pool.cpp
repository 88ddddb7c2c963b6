#include "thread_pool.h"

#include <chrono>

namespace vllm_mlx_kernels {

namespace {

// Threads spin this long before sleeping: the matmuls of one decode step come tens of
// microseconds apart and a futex wake-up costs about as much. Longer spins only burn
// CPU that other processes (or our own other thread) need on a busy machine.
constexpr auto kSpin = std::chrono::microseconds(50);

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

template <class Done>
bool spin_until(Done done) {
  auto until = std::chrono::steady_clock::now() + kSpin;
  for (int spins = 1;; ++spins) {
    if (done()) {
      return true;
    }
    relax();
    if (spins % 128 == 0 && std::chrono::steady_clock::now() > until) {
      return false;
    }
  }
}


} // namespace

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& t : workers_) {
    t.join();
  }
}

void ThreadPool::grow(int workers) {
  while (static_cast<int>(workers_.size()) < workers) {
    int index = static_cast<int>(workers_.size());
    workers_.emplace_back([this, index] { work(index); });
  }
}

void ThreadPool::run(int n, const std::function<void(int)>& fn) {
  if (n <= 1) {
    fn(0);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  grow(n - 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    jobs_ = n;
    pending_.store(n - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  fn(0);
  auto finished = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(finished)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, finished);
  }
}

void ThreadPool::work(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto fresh = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(fresh)) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, fresh);
    }
    const std::function<void(int)>* job;
    int jobs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) {
        return;
      }
      seen = generation_.load(std::memory_order_acquire);
      job = job_;
      jobs = jobs_;
    }
    if (index + 1 < jobs) {
      (*job)(index + 1);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu_); // the caller may be between check and wait
        done_cv_.notify_one();
      }
    }
  }
}

} // namespace vllm_mlx_kernels
