// Allocator statistics, with PyTorch's names and semantics
// (torch.cuda.memory_stats()).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>

namespace cachealloc {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // cumulative increases
  std::int64_t freed = 0;      // cumulative decreases

  void increase(std::int64_t amount) noexcept {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void decrease(std::int64_t amount) noexcept {
    current -= amount;
    freed += amount;
  }
  void reset_peak() noexcept { peak = current; }
  void reset_accumulated() noexcept { allocated = freed = 0; }
};

enum StatType : std::size_t { stat_all = 0, stat_small_pool = 1, stat_large_pool = 2 };
inline constexpr std::size_t kStatTypes = 3;
using StatArray = std::array<Stat, kStatTypes>;

struct MemoryStats {
  StatArray allocation;            // live allocations
  StatArray segment;               // segments reserved from the device
  StatArray active;                // allocated or waiting for stream events
  StatArray inactive_split;        // free blocks that are part of a split segment
  StatArray allocated_bytes;       // block bytes handed out
  StatArray reserved_bytes;        // bytes reserved from the device
  StatArray active_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;       // bytes the program asked for
  Stat oversize_allocations;       // allocations >= max_split_size
  Stat oversize_segments;          // segments >= max_split_size
  std::int64_t num_alloc_retries = 0;  // allocations that needed the free-cache-and-retry path
  std::int64_t num_ooms = 0;
  std::int64_t num_sync_all_streams = 0;
  std::int64_t num_device_alloc = 0;   // cudaMalloc calls
  std::int64_t num_device_free = 0;    // cudaFree calls
  std::int64_t max_split_size = 0;   // the setting in bytes; -1 without a limit, as PyTorch reports it

  // Flattens to PyTorch's keys: "allocated_bytes.all.current", ...
  std::map<std::string, std::int64_t> to_map() const;
};

// A readable table like torch.cuda.memory_summary().
std::string format_summary(const MemoryStats& stats);

// "3.81 MiB", "20.00 GiB" ...
std::string format_bytes(std::uint64_t bytes);

}  // namespace cachealloc
