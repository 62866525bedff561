// CPython's frames as a frame source of the recorder (cachealloc.h,
// cachealloc_frame_source): what stacks=python and native+python record.
//
// The capture walks the calling thread's own frame chain as py-spy and
// memray do, without the GIL: PyTorch's ops release the GIL before they
// allocate, and only the thread that runs a frame chain changes it, so the
// chain is still while its own thread reads it. Each (code object,
// instruction) is named once, when first seen (function, file, line, read
// while the code object is alive), and gets a token; a thread-local cache in
// front of a sharded table makes a frame seen before cost a few ns.
//
// Built against Python's headers only (not torch), for the interpreter those
// headers are: CPython 3.11, 3.12 and 3.13, through their internal frame
// structs. Other versions, and an interpreter of another minor version than
// the headers' (which would lay its frames out otherwise), get a source that
// captures nothing (python_frames_supported() says so).
#pragma once

#include "cachealloc/cachealloc.h"

namespace cachealloc::python {

// The source to install with cachealloc_set_frame_source (or
// cachealloc::set_frame_source). Its interpreter_code is inside the running
// interpreter, for the merged captures. Thread-safe; Python must be
// initialized before the first capture.
cachealloc_frame_source python_frame_source() noexcept;

// Whether this build walks the running interpreter's frames: CPython 3.11 to
// 3.13, the minor version of the headers it was built against.
bool python_frames_supported() noexcept;

}  // namespace cachealloc::python
