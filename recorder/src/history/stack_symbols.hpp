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
};

// `return_address` as captured: we look up return_address - 1, the call
// instruction, so the line is the call's and not the next statement's.
// Never throws; unknown parts stay empty.
SymbolizedFrame symbolize(std::uintptr_t return_address) noexcept;

}  // namespace cachealloc::detail
