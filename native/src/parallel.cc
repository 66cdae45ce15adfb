// The threads behind parallel_for (include/sfann/parallel.h): one persistent pool of workers per
// process, so that a search call of a millisecond does not start and join its threads each time.
#include "sfann/parallel.h"

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <system_error>
#include <vector>

#include <pthread.h>

namespace sfann {
namespace {

// How long a caller that has finished its own share polls for the workers' last chunks before it
// sleeps: about 0.1-0.2 ms, the length of a chunk of searches.
constexpr int kWaitSpins = 4096;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::this_thread::yield();
#endif
}

// The first exception thrown by the bodies of one call.
class FirstError {
 public:
  void record(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::move(error);
  }
  // Rethrows the recorded exception, if any, and forgets it.
  void rethrow() {
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error.swap(error_);
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
};

void call(void (*body)(void*, int), void* ctx, int t, FirstError& error) {
  try {
    body(ctx, t);
  } catch (...) {
    error.record(std::current_exception());
  }
}

// A call on threads started for it alone: for a caller that finds the pool busy.
void run_on_new_threads(int threads, void (*body)(void*, int), void* ctx) {
  FirstError error;
  std::vector<std::thread> helpers;
  helpers.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(call, body, ctx, t, std::ref(error));
    } catch (const std::system_error&) {  // no more threads to be had: run on those there are
      break;
    }
  }
  call(body, ctx, 0, error);
  for (auto& helper : helpers) helper.join();
  error.rethrow();
}

// Workers that sleep until a call hands them its body; used by one caller at a time (g_busy).
// A worker serves for the life of the process: the pool is never destroyed, so nothing waits for
// its threads at exit.
class Pool {
 public:
  void run(int threads, void (*body)(void*, int), void* ctx) {
    const int helpers = grow(threads - 1);
    pending_.store(helpers, std::memory_order_relaxed);
    for (int w = 0; w < helpers; ++w) workers_[w]->hand(body, ctx);
    call(body, ctx, 0, error_);
    wait();
    error_.rethrow();
  }

 private:
  struct alignas(64) Worker {
    void hand(void (*b)(void*, int), void* c) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        body = b;
        ctx = c;
      }
      wake.notify_one();
    }
    std::mutex mutex;
    std::condition_variable wake;
    void (*body)(void*, int) = nullptr;  // the call to serve next (guarded by mutex)
    void* ctx = nullptr;
  };

  // Starts workers until there are `wanted`; returns how many there are (fewer where the system
  // refuses more threads), at most `wanted`.
  int grow(int wanted) {
    if (static_cast<int>(workers_.size()) < wanted) workers_.reserve(wanted);
    while (static_cast<int>(workers_.size()) < wanted) {
      auto worker = std::make_unique<Worker>();
      const int t = static_cast<int>(workers_.size()) + 1;
      try {
        std::thread(&Pool::serve, this, worker.get(), t).detach();
      } catch (const std::system_error&) {
        break;
      }
      workers_.push_back(std::move(worker));
    }
    return std::min<int>(wanted, static_cast<int>(workers_.size()));
  }

  void serve(Worker* worker, int t) {
    for (;;) {
      void (*body)(void*, int);
      void* ctx;
      {
        std::unique_lock<std::mutex> lock(worker->mutex);
        worker->wake.wait(lock, [worker] { return worker->body != nullptr; });
        body = worker->body;
        ctx = worker->ctx;
        worker->body = nullptr;
      }
      call(body, ctx, t, error_);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(done_mutex_);
        done_.notify_one();
      }
    }
  }

  // Until every worker handed the current call has returned from its body.
  void wait() {
    for (int spin = 0; spin < kWaitSpins; ++spin) {
      if (pending_.load(std::memory_order_acquire) == 0) return;
      cpu_relax();
    }
    std::unique_lock<std::mutex> lock(done_mutex_);
    done_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  }

  std::vector<std::unique_ptr<Worker>> workers_;  // worker w runs bodies as t = w + 1
  alignas(64) std::atomic<int> pending_{0};       // workers still in the current call's body
  alignas(64) std::mutex done_mutex_;
  std::condition_variable done_;
  FirstError error_;
};

std::atomic<bool> g_busy{false};  // a caller is using g_pool
Pool* g_pool = nullptr;           // created by the first caller that takes g_busy

// In a forked child only the forking thread exists: the parent's workers are gone and its pool
// may be in the middle of a call. The child leaves that pool behind and starts its own.
void forget_pool_after_fork() {
  g_pool = nullptr;
  g_busy.store(false);
}

}  // namespace

void run_on_threads(int threads, void (*body)(void*, int), void* ctx) {
  if (threads <= 1) {
    body(ctx, 0);
    return;
  }
  bool idle = false;
  if (!g_busy.compare_exchange_strong(idle, true, std::memory_order_acquire)) {
    run_on_new_threads(threads, body, ctx);
    return;
  }
  struct Release {
    ~Release() { g_busy.store(false, std::memory_order_release); }
  } release;
  static const bool fork_safe = pthread_atfork(nullptr, nullptr, forget_pool_after_fork) == 0;
  if (!fork_safe) {  // a pool that a forked child would take for its own: not without the hook
    run_on_new_threads(threads, body, ctx);
    return;
  }
  if (!g_pool) g_pool = new Pool();
  g_pool->run(threads, body, ctx);
}

}  // namespace sfann
