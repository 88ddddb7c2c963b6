// A small persistent thread pool for splitting one matmul over output rows.
// Why not std::async or OpenMP: a decode step runs ~200 small matmuls, so waking
// threads must cost microseconds, and the extension must not drag in a second OpenMP
// runtime beside the one the BLAS library may bring.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace vllm_mlx_kernels {

class ThreadPool {
 public:
  ~ThreadPool();
  // Runs fn(0..n-1), fn(0) on the calling thread; returns when all are done.
  void run(int n, const std::function<void(int)>& fn);

 private:
  void grow(int workers);
  void work(int index);

  std::mutex run_mu_; // one job at a time (several MLX streams may call in)
  std::mutex mu_;
  std::condition_variable cv_; // workers wait here for a job
  std::condition_variable done_cv_; // the caller waits here for the last worker
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  const std::function<void(int)>* job_ = nullptr;
  int jobs_ = 0;
  bool stop_ = false;
};

} // namespace vllm_mlx_kernels
