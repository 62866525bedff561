// A test fixture for python/tests/test_python_frames.py: an allocation made
// through the C ABI on a thread that never ran Python code.
#include <thread>

#include "cachealloc/cachealloc.h"

extern "C" __attribute__((visibility("default"))) void* allocate_on_native_thread(size_t size) {
  void* ptr = nullptr;
  std::thread([&] { ptr = cachealloc_malloc(size, 0); }).join();
  return ptr;
}
