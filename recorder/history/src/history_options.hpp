// The checks on HistoryOptions that the recorder's constructor and start()
// share. Private to the recorder library.
#pragma once

#include "cachealloc/history.hpp"

namespace cachealloc::detail {

// Throws InvalidArgument, naming the option, for a max_entries of 0 or a
// max_frames outside [1, kMaxStackFrames].
void validate(const HistoryOptions& options);

}  // namespace cachealloc::detail
