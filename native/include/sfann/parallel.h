// parallel_for over [0, n) with dynamic chunks on plain std::threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace sfann {

inline int resolve_threads(int threads) {
  if (threads > 0) return threads;
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

// Calls fn(i, thread_index) for every i in [begin, end); the first exception is rethrown.
template <typename Fn>
void parallel_for(size_t begin, size_t end, int threads, Fn&& fn, size_t chunk = 16) {
  if (end <= begin) return;
  threads = std::max(1, std::min<int>(resolve_threads(threads), static_cast<int>((end - begin + chunk - 1) / chunk)));
  if (threads == 1) {
    for (size_t i = begin; i < end; ++i) fn(i, 0);
    return;
  }
  std::atomic<size_t> next(begin);
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&](int t) {
    try {
      for (;;) {
        size_t start = next.fetch_add(chunk);
        if (start >= end) break;
        size_t stop = std::min(end, start + chunk);
        for (size_t i = start; i < stop; ++i) fn(i, t);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(end);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace sfann
