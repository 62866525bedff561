// Allocator settings, with the same names, syntax and defaults as PyTorch's
// PYTORCH_CUDA_ALLOC_CONF, read from CACHEALLOC_CONF.
#pragma once

#include <array>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>

namespace cachealloc {

// Number of power-of-two size intervals for roundup_power2_divisions: one per
// power of two from 1 MiB up to 64 GiB, as in PyTorch.
inline constexpr std::size_t kRoundupIntervals = 16;

struct AllocatorConfig {
  // Blocks at least this large are "oversize": never split, and reused only
  // for requests within max_non_split_rounding of their size.
  // "max_split_size_mb"; unlimited by default.
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
  // "max_non_split_rounding_mb"; 20 MiB by default.
  std::size_t max_non_split_rounding = 20u << 20;
  // Divisions per power-of-two interval [1 MiB, 2 MiB), ... , [32 GiB, 64 GiB)
  // (the first also covers smaller sizes, the last larger ones). 0 or 1 means
  // plain 512-byte rounding. "roundup_power2_divisions".
  std::array<std::size_t, kRoundupIntervals> roundup_power2_divisions{};
  // Fraction of the memory cap above which cached blocks are garbage
  // collected; 0 disables. Only acts when a memory fraction is set.
  // "garbage_collection_threshold".
  double garbage_collection_threshold = 0.0;
  // "expandable_segments".
  bool expandable_segments = false;
  // The text this came from, for reports.
  std::string source;

  friend bool operator==(const AllocatorConfig&, const AllocatorConfig&) = default;
};

// Parses PyTorch's syntax: comma-separated key:value pairs, e.g.
// "max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.6".
// roundup_power2_divisions also takes PyTorch's list form "[256:1,512:2,>:8]".
// Throws ConfigError naming the key and value for an unknown key, a malformed
// pair or a value out of range. An empty string gives the defaults.
AllocatorConfig parse_config(std::string_view text);

// parse_config(getenv("CACHEALLOC_CONF")), or defaults when it is unset.
AllocatorConfig config_from_environment();

// The divisions that apply to a (rounded-up-to-512) size.
std::size_t roundup_divisions_for(const AllocatorConfig& config, std::size_t size) noexcept;

// Canonical text of the settings, e.g. for a snapshot.
std::string to_string(const AllocatorConfig& config);

}  // namespace cachealloc
