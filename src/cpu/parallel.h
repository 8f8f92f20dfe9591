// The CPU backends' one threading pattern: independent tasks 0..n-1 handed out
// one at a time (an atomic counter) to a few threads, the calling one included.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

namespace flashkda::cpu {

// The threads a request asks for: requested_threads <= 0 means one per hardware thread.
inline int64_t worker_threads(int requested_threads) {
  return requested_threads > 0 ? requested_threads : std::max<int64_t>(1, std::thread::hardware_concurrency());
}

// body(local, i) for every task i; each thread first makes its own scratch with
// make_local(). Threads: worker_threads(requested_threads), at most one a task.
template <typename MakeLocal, typename Body>
void parallel_for(int64_t tasks, int requested_threads, MakeLocal make_local, Body body) {
  if (tasks <= 0) return;
  const int64_t threads = std::min(worker_threads(requested_threads), tasks);
  std::atomic<int64_t> next{0};
  auto worker = [&]() {
    auto local = make_local();
    for (int64_t i = next.fetch_add(1); i < tasks; i = next.fetch_add(1)) body(local, i);
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));  // no reallocation once threads run
  // A thread that cannot start (the process's limit) leaves its tasks to the
  // others; letting the exception out would destroy the started ones unjoined.
  for (int64_t t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;
    }
  }
  worker();
  for (auto& th : pool) th.join();
}

// The same without per-thread scratch: body(i).
template <typename Body>
void parallel_for(int64_t tasks, int requested_threads, Body body) {
  parallel_for(tasks, requested_threads, [] { return 0; }, [&](int, int64_t i) { body(i); });
}

}  // namespace flashkda::cpu
