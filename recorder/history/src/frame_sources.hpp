// The interpreter's frames (set_frame_source): the installed source, read on
// the hot path, and every source ever installed, for naming their tokens at
// dump time. Private to the recorder library.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cachealloc/cachealloc.h"
#include "stack_symbols.hpp"

namespace cachealloc::detail {

// A token in a stack: bit 63 (never a user-space return address on x86-64
// or AArch64), the source's index in bits 56-62, the source's token below.
inline constexpr std::uint64_t kInterpreterFrameTag = std::uint64_t{1} << 63;
inline constexpr unsigned kFrameSourceShift = 56;
inline constexpr std::uint64_t kSourceTokenMask = (std::uint64_t{1} << kFrameSourceShift) - 1;
inline constexpr std::uint32_t kMaxFrameSources = 64;
static_assert(std::is_same_v<std::uintptr_t, std::uint64_t>, "stack frames and tokens share one word");

inline bool is_interpreter_token(std::uintptr_t frame) noexcept { return (frame & kInterpreterFrameTag) != 0; }

struct InstalledFrameSource {
  cachealloc_frame_source source{};
  std::uint64_t tag = 0;  // kInterpreterFrameTag | index << kFrameSourceShift
  // The executable segment that holds source.interpreter_code; empty (0, 0)
  // when it is null or not found, and the native frames are then kept whole.
  std::uintptr_t interpreter_begin = 0;
  std::uintptr_t interpreter_end = 0;
};

// The source installed now, or nullptr: one atomic load. Sources are never
// freed, so the pointer stays valid after another is installed.
const InstalledFrameSource* installed_frame_source() noexcept;

// Replaces frames[cut..depth) with the interpreter's frames, tagged, where
// `cut` is the first native frame inside the interpreter (depth when none
// is): the merged stack, at most max_frames long. Returns its depth. A
// thread that runs no interpreter code keeps its `depth` native frames.
std::uint32_t append_interpreter_frames(const InstalledFrameSource& source, std::uintptr_t* frames,
                                        std::uint32_t depth, std::uint32_t max_frames) noexcept;

// A tagged token's function, file and line, from the source that made it
// (`interpreter` set); nothing for a token its source does not know,
// `failed` when describe throws.
SymbolizedFrame describe_interpreter_frame(std::uintptr_t token) noexcept;

}  // namespace cachealloc::detail
