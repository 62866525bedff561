#include "stack_symbols.hpp"

#include "frame_sources.hpp"

#include <dlfcn.h>

#include <atomic>

#include <boost/stacktrace/frame.hpp>

namespace cachealloc::detail {

namespace {
std::atomic<Symbolizer> g_symbolizer{nullptr};
}  // namespace

Symbolizer replace_symbolizer(Symbolizer symbolizer) noexcept { return g_symbolizer.exchange(symbolizer); }

SymbolizedFrame symbolize(std::uintptr_t return_address) noexcept {
  SymbolizedFrame out;
  if (return_address == 0) return out;
  if (is_interpreter_token(return_address)) return describe_interpreter_frame(return_address);
  if (const Symbolizer replacement = g_symbolizer.load()) {
    try {
      return replacement(return_address);
    } catch (...) {
      out.failed = true;
      return out;
    }
  }
  const std::uintptr_t call_site = return_address - 1;
  try {
    const boost::stacktrace::frame frame(reinterpret_cast<boost::stacktrace::frame::native_frame_ptr_t>(call_site));
    out.function = frame.name();
    out.file = frame.source_file();
    out.line = static_cast<std::uint32_t>(frame.source_line());
  } catch (...) {
    // A frame we cannot name stays a bare address; the dump says it happened.
    out.failed = true;
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
