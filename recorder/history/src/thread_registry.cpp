// The thread registry of thread_registry.hpp.
#include "thread_registry.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

namespace cachealloc::detail {

namespace {
std::mutex g_threads_mutex;
std::vector<std::uint64_t> g_threads;

std::uint32_t register_thread() noexcept {
  const auto tid = static_cast<std::uint64_t>(::syscall(SYS_gettid));
  std::lock_guard lock(g_threads_mutex);
  try {
    g_threads.push_back(tid);
  } catch (...) {
    return 0;  // out of memory: attribute to the first thread rather than fail
  }
  return static_cast<std::uint32_t>(g_threads.size() - 1);
}
}  // namespace

std::uint32_t thread_index() noexcept {
  thread_local const std::uint32_t index = register_thread();
  return index;
}

std::vector<std::uint64_t> registered_threads() {
  std::lock_guard lock(g_threads_mutex);
  return g_threads;
}

}  // namespace cachealloc::detail
