#include "frame_sources.hpp"

#include "stack_capture.hpp"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "cachealloc/errors.hpp"
#include "cachealloc/history.hpp"

namespace cachealloc {
namespace detail {
namespace {

// Append-only: a token's source must outlive every snapshot that holds it.
std::array<InstalledFrameSource, kMaxFrameSources> g_sources;
std::uint32_t g_source_count = 0;  // guarded by g_install
std::mutex g_install;
std::atomic<const InstalledFrameSource*> g_installed{nullptr};

struct CodeRange {
  std::uintptr_t address = 0;
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
};

// The executable PT_LOAD segment that holds `address`, in any loaded object.
void find_executable_segment(CodeRange& range) {
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) -> int {
        auto& r = *static_cast<CodeRange*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& header = info->dlpi_phdr[i];
          if (header.p_type != PT_LOAD || (header.p_flags & PF_X) == 0) continue;
          const std::uintptr_t begin = info->dlpi_addr + header.p_vaddr;
          if (r.address >= begin && r.address < begin + header.p_memsz) {
            r.begin = begin;
            r.end = begin + header.p_memsz;
            return 1;
          }
        }
        return 0;
      },
      &range);
}

}  // namespace

const InstalledFrameSource* installed_frame_source() noexcept { return g_installed.load(std::memory_order_acquire); }

std::uint32_t append_interpreter_frames(const InstalledFrameSource& installed, std::uintptr_t* frames,
                                        std::uint32_t depth, std::uint32_t max_frames) noexcept {
  std::uint64_t tokens[kMaxStackFrames];
  const std::uint32_t room = std::min(max_frames, kMaxStackFrames);
  std::uint32_t count = installed.source.capture(tokens, room, installed.source.context);
  if (count == 0) return depth;
  count = std::min(count, room);
  std::uint32_t cut = depth;
  for (std::uint32_t i = 0; i < depth; ++i) {
    if (frames[i] >= installed.interpreter_begin && frames[i] < installed.interpreter_end) {
      cut = i;
      break;
    }
  }
  cut = std::min(cut, room);
  const std::uint32_t kept = std::min(count, room - cut);
  for (std::uint32_t i = 0; i < kept; ++i) frames[cut + i] = installed.tag | (tokens[i] & kSourceTokenMask);
  return cut + kept;
}

SymbolizedFrame describe_interpreter_frame(std::uintptr_t token) noexcept {
  // A token its source does not know stays a bare value, as an address the
  // symbolizer cannot name does; only a describe that throws is a failure.
  SymbolizedFrame out;
  const auto index = static_cast<std::uint32_t>((token & ~kInterpreterFrameTag) >> kFrameSourceShift);
  const InstalledFrameSource* installed = nullptr;
  {
    std::lock_guard lock(g_install);
    if (index < g_source_count) installed = &g_sources[index];
  }
  if (installed == nullptr) return out;
  try {
    cachealloc_interpreter_frame frame{};
    if (installed->source.describe(token & kSourceTokenMask, &frame, installed->source.context) == 0) return out;
    out.interpreter = true;
    if (frame.function) out.function = frame.function;
    if (frame.file) out.file = frame.file;
    out.line = frame.line;
  } catch (...) {
    out = SymbolizedFrame{};
    out.failed = true;
  }
  return out;
}

}  // namespace detail

void set_frame_source(const cachealloc_frame_source* source) {
  if (source == nullptr) {
    detail::g_installed.store(nullptr, std::memory_order_release);
    return;
  }
  if (source->capture == nullptr || source->describe == nullptr)
    throw InvalidArgument("set_frame_source: capture and describe must not be null");
  std::lock_guard lock(detail::g_install);
  for (std::uint32_t i = 0; i < detail::g_source_count; ++i) {
    const cachealloc_frame_source& known = detail::g_sources[i].source;
    if (known.capture == source->capture && known.describe == source->describe && known.context == source->context &&
        known.interpreter_code == source->interpreter_code) {
      detail::g_installed.store(&detail::g_sources[i], std::memory_order_release);
      return;
    }
  }
  if (detail::g_source_count == detail::kMaxFrameSources)
    throw InvalidArgument("set_frame_source: a process may install at most " +
                          std::to_string(detail::kMaxFrameSources) + " different frame sources");
  detail::InstalledFrameSource& installed = detail::g_sources[detail::g_source_count];
  installed.source = *source;
  installed.source.size = sizeof(cachealloc_frame_source);
  installed.tag = detail::kInterpreterFrameTag | (std::uint64_t{detail::g_source_count} << detail::kFrameSourceShift);
  if (source->interpreter_code != nullptr) {
    detail::CodeRange range;
    range.address = reinterpret_cast<std::uintptr_t>(source->interpreter_code);
    detail::find_executable_segment(range);
    installed.interpreter_begin = range.begin;
    installed.interpreter_end = range.end;
  }
  ++detail::g_source_count;
  detail::g_installed.store(&installed, std::memory_order_release);
}

}  // namespace cachealloc
