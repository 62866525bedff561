// The invariants every reader holds a snapshot to, whatever its format.
//
// Our format's reader (format.hpp) and the PyTorch pickle reader (pickle.hpp)
// both call layout_problem() on what they decoded, so a file that breaks the
// model's promises is refused the same way whichever format carries it; the
// analyzer then relies on them without checking again:
//   - no segment wraps around the address space (address + total_size fits);
//   - the segments of one device do not overlap;
//   - each segment's blocks are in address order, inside the segment, apart,
//     and their sizes add up to the segment's: they tile it from its address;
//   - the same for each ring-start layout (RingStart::segments);
//   - all text (the string table, the header, device names and notes, the
//     settings) is valid UTF-8 (RFC 3629, text.hpp). Python's pickle.loads
//     refuses a string that is not; the recorder writes only valid text.
//
// Cost: O(segments log segments + blocks + bytes of text), no allocation
// beyond one index per layout. Thread safety: pure.
#pragma once

#include <optional>
#include <string>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::snapshot {

// The first broken invariant, described on one line without the file's own
// bytes (e.g. "segment 3 (device 0) overlaps segment 2"), or nothing when
// the snapshot holds them all. The events are not looked at.
std::optional<std::string> layout_problem(const Snapshot& snapshot);

}  // namespace cachealloc::snapshot
