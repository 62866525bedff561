// PyTorch's caching-allocator constants (c10/cuda/CUDACachingAllocator.cpp),
// which the allocator's policy follows and the analyzer's replay of a
// recording needs too (what empty_cache() can unmap of an expandable
// segment, say).
//
// Thread safety: constants only.
#pragma once

#include <cstddef>

namespace cachealloc {

inline constexpr std::size_t kMinBlockSize = 512;          // every size is a multiple of this
inline constexpr std::size_t kSmallSize = 1u << 20;        // largest "small" request
inline constexpr std::size_t kSmallBuffer = 2u << 20;      // small-pool segment size; expandable small-pool chunk
inline constexpr std::size_t kLargeBuffer = 20u << 20;     // segment for 1-10 MiB requests; expandable large-pool chunk
inline constexpr std::size_t kMinLargeAlloc = 10u << 20;   // from here segments fit the request
inline constexpr std::size_t kRoundLarge = 2u << 20;       // large segments round to this

}  // namespace cachealloc
