// A small persistent thread pool for splitting one matmul into chunks of output rows.
// Why not std::async or OpenMP: a decode step runs ~200 small matmuls, so handing out
// work must cost microseconds, and the extension must not drag in a second OpenMP
// runtime beside the one the BLAS library may bring.
//
// Why chunks are claimed, not assigned: on a busy 2-core machine a sleeping worker may
// take tens of microseconds to wake (or be descheduled). The caller starts on the chunks
// at once and the worker takes what is left when it gets there, so a late worker never
// holds the caller up by more than one chunk. Idle workers sleep on a futex after a very
// short spin instead of spinning between matmuls and burning the other core.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace vllm_mlx_kernels {

// How long (microseconds) an idle worker spins for the next job before it sleeps.
void set_worker_spin_us(int us);
int worker_spin_us();

class ThreadPool {
 public:
  ~ThreadPool();
  // Runs fn(0..chunks-1) on the calling thread and up to threads-1 workers; returns
  // when every chunk is done.
  void run(int threads, int chunks, const std::function<void(int)>& fn);

 private:
  void grow(int workers);
  void work();
  bool claim_and_run(uint32_t generation);

  std::mutex run_mu_; // one job at a time (several MLX streams may call in)
  std::vector<std::thread> workers_;
  uint32_t generation_ = 0; // the caller's copy, under run_mu_
  // (generation << 32 | next chunk): a claim from an older job fails its compare-exchange.
  std::atomic<uint64_t> claim_{0};
  std::atomic<uint32_t> wake_{0}; // workers sleep on this (the current generation)
  std::atomic<uint32_t> done_{0}; // chunks finished in the current job
  std::atomic<const std::function<void(int)>*> job_{nullptr};
  std::atomic<int> chunks_{0};
  std::atomic<int> sleepers_{0}; // workers asleep on wake_ (skip the syscall when none)
  std::atomic<bool> caller_asleep_{false};
  std::atomic<bool> stop_{false};
};

} // namespace vllm_mlx_kernels
