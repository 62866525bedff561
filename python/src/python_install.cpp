// libcachealloc_python.so: CPython's frames (python_frames.hpp) for the
// recorder of libcachealloc.so, in programs that reach the C ABI from Python
// (ctypes, PyTorch's CUDAPluggableAllocator):
//   ctypes.CDLL("libcachealloc.so")
//   ctypes.PyDLL("libcachealloc_python.so").cachealloc_python_install()
// then record with CACHEALLOC_STACKS_PYTHON or CACHEALLOC_STACKS_NATIVE_PYTHON
// (or CACHEALLOC_HISTORY=...,stacks:python). The torch extension links the
// same source itself.
#include "cachealloc/cachealloc.h"
#include "python_frames.hpp"

extern "C" {

// Installs the frame source. Returns cachealloc_set_frame_source's status.
__attribute__((visibility("default"))) int cachealloc_python_install(void) {
  const cachealloc_frame_source source = cachealloc::python::python_frame_source();
  return cachealloc_set_frame_source(&source);
}

// 1 when this build walks the running interpreter's frames (CPython 3.11 to
// 3.13, the version of the headers it was built against), 0 when its frame
// source captures nothing.
__attribute__((visibility("default"))) int cachealloc_python_frames_supported(void) {
  return cachealloc::python::python_frames_supported() ? 1 : 0;
}

}  // extern "C"
