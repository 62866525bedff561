// Turning raw return addresses into function, file, line and module, at
// dump time only (~1 us a frame). Private to the recorder library.
#pragma once

#include <cstdint>
#include <string>

namespace cachealloc::detail {

struct SymbolizedFrame {
  std::string function;  // demangled; empty when unknown
  std::string file;
  std::uint32_t line = 0;
  std::string module;  // the shared object or executable holding the code
  // The symbolizer failed (threw) on this frame, rather than finding no
  // name: the dump then says so on stderr and recording stops (history.hpp).
  bool failed = false;
  // An interpreter's frame (frame_sources.hpp): a snapshot gives it no
  // address and no module, as PyTorch's Python frames have none.
  bool interpreter = false;
};

// `return_address` as captured: we look up return_address - 1, the call
// instruction, so the line is the call's and not the next statement's.
// A tagged interpreter token is described by its frame source instead.
// Never throws; unknown parts stay empty.
SymbolizedFrame symbolize(std::uintptr_t return_address) noexcept;

// Replaces the symbolizer behind symbolize() (nullptr: Boost.Stacktrace's
// again) and returns the previous one. For tests that make it fail: a
// replacement that throws gives a frame with `failed` set. Thread safety:
// atomic; call it while no dump runs.
using Symbolizer = SymbolizedFrame (*)(std::uintptr_t return_address);
Symbolizer replace_symbolizer(Symbolizer symbolizer) noexcept;

}  // namespace cachealloc::detail
