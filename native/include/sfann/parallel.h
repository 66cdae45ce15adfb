// parallel_for over [begin, end) in dynamic chunks, on the calling thread and the workers of a
// persistent thread pool (src/parallel.cc).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <type_traits>

namespace sfann {

inline int resolve_threads(int threads) {
  if (threads > 0) return threads;
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

// Calls body(ctx, t) on the calling thread (t = 0) and on up to threads - 1 other threads
// (t = 1, 2, ...), and returns once every call has returned; the first exception one of them
// threw is rethrown then. A call may get fewer threads than it asks for (the pool is busy with
// another caller's work, or the system refuses new threads), so bodies share their work out
// dynamically and never count on a given t being run.
//
// The other threads are the workers of one pool per process, started on first use, grown to
// the largest count asked for, and reused by every later call. One caller uses the pool at a
// time: a concurrent caller, or a body that itself calls parallel_for, gets threads started for
// its call alone. A child process forked from this one starts a pool of its own (the parent's
// workers do not exist in it).
void run_on_threads(int threads, void (*body)(void* ctx, int t), void* ctx);

// Calls fn(i, t) for every i in [begin, end), on threads with indexes t in [0, threads) that
// take chunks of `chunk` indexes as they go; the first exception is rethrown (the remaining
// chunks are then skipped).
template <typename Fn>
void parallel_for(size_t begin, size_t end, int threads, Fn&& fn, size_t chunk = 16) {
  if (end <= begin) return;
  threads = std::max(1, std::min<int>(resolve_threads(threads), static_cast<int>((end - begin + chunk - 1) / chunk)));
  if (threads == 1) {
    for (size_t i = begin; i < end; ++i) fn(i, 0);
    return;
  }
  struct Work {
    alignas(64) std::atomic<size_t> next;  // alone on its cache line: every chunk writes it
    alignas(64) size_t end;
    size_t chunk;
    std::remove_reference_t<Fn>* fn;
  } work;
  work.next.store(begin, std::memory_order_relaxed);
  work.end = end;
  work.chunk = chunk;
  work.fn = &fn;
  auto body = [](void* ctx, int t) {
    Work& w = *static_cast<Work*>(ctx);
    try {
      for (;;) {
        const size_t start = w.next.fetch_add(w.chunk, std::memory_order_relaxed);
        if (start >= w.end) break;
        const size_t stop = std::min(w.end, start + w.chunk);
        for (size_t i = start; i < stop; ++i) (*w.fn)(i, t);
      }
    } catch (...) {
      w.next.store(w.end, std::memory_order_relaxed);
      throw;
    }
  };
  run_on_threads(threads, body, &work);
}

}  // namespace sfann
