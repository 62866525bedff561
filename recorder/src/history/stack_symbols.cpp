#include "stack_symbols.hpp"

#include <dlfcn.h>

#include <boost/stacktrace/frame.hpp>

namespace cachealloc::detail {

SymbolizedFrame symbolize(std::uintptr_t return_address) noexcept {
  SymbolizedFrame out;
  if (return_address == 0) return out;
  const std::uintptr_t call_site = return_address - 1;
  try {
    const boost::stacktrace::frame frame(reinterpret_cast<boost::stacktrace::frame::native_frame_ptr_t>(call_site));
    out.function = frame.name();
    out.file = frame.source_file();
    out.line = static_cast<std::uint32_t>(frame.source_line());
  } catch (...) {
    // Symbolizing is best effort: a frame we cannot name stays a bare address.
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(call_site), &info) != 0 && info.dli_fname) {
    try {
      out.module = info.dli_fname;
    } catch (...) {
    }
  }
  return out;
}

}  // namespace cachealloc::detail
