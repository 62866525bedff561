// PoolInference: which requests went to a private pool (a CUDA graph's
// capture, a MemPool), read from where the recording put their segments.
#include <limits>

#include "whatif/replay_parts.hpp"

namespace cachealloc::analyzer::whatif {

using snapshot::Event;
using snapshot::EventKind;

void PoolInference::on_release(std::size_t i, const Event& e, EventKind previous) {
  // (Our recorder's empty_cache event follows its releases.)
  if (previous != EventKind::segment_release) run_start_ = i;
  const auto it = segments_.find(e.address);
  if (it == segments_.end()) return;
  const std::uint32_t pool = it->second.second;
  segments_.erase(it);
  if (released_.insert(pool).second) {
    releases.push_back({run_start_, pool});
    std::erase_if(open_, [pool](const auto& entry) { return entry.second == pool; });
  }
}

void PoolInference::on_alloc(std::size_t i, const Event& e, const Replay& engine, bool fresh) {
  std::uint32_t pool = 0;
  const auto open = open_.find(e.stream);
  if (fresh) {
    const std::uint64_t size = e.size;
    if (open != open_.end()) {
      if (fits(engine, e.stream, size, open->second)) open_.erase(open);  // the capture has ended
      else pool = open->second;
    }
    if (pool == 0 && fits(engine, e.stream, size, 0)) {
      pool = ++pools;
      open_[e.stream] = pool;
    }
    if (pool != 0) segments_[reserved_address_] = {reserved_address_ + reserved_size_, pool};
  } else if (!segments_.empty()) {
    pool = pool_at(e.address);
    if (open != open_.end() && pool != open->second) open_.erase(open);
  }
  if (pool != 0 && !released_.contains(pool)) routes.push_back({i, pool});
}

std::uint32_t PoolInference::pool_at(std::uint64_t address) const {
  auto it = segments_.upper_bound(address);
  if (it == segments_.begin()) return 0;
  --it;
  return address < it->second.first ? it->second.second : 0;
}

// Whether `pool` held, on `stream`, a free block that PyTorch's best fit
// takes for a block of `size` bytes (the segment just reserved aside). Reads
// each segment's largest free block: where max_split_size turns that one
// away, a smaller one that fits is not seen, and no pool is inferred. Under
// a max_split_size an oversize block is not split, and a PyTorch trace
// sizes it by its request: the free block seen after it may not exist, so
// large-pool segments are then no evidence.
bool PoolInference::fits(const Replay& engine, std::uint64_t stream, std::uint64_t size, std::uint32_t pool) const {
  constexpr std::uint64_t kSmallSize = std::uint64_t{1} << 20;
  if (engine.cache_figures(false).cached_free < size) return false;
  const bool small = size <= kSmallSize;
  if (!small && config_.max_split_size != std::numeric_limits<std::size_t>::max()) return false;
  for (const SegmentFigures& s : engine.segment_figures()) {
    if (s.stream != stream || s.large_pool == small || s.address == reserved_address_ || s.expandable) continue;
    if (pool_at(s.address) != pool || s.largest_free < size) continue;
    const std::uint64_t block = s.largest_free;
    if (size < config_.max_split_size && block >= config_.max_split_size) continue;
    if (size >= config_.max_split_size && block >= size + config_.max_non_split_rounding) continue;
    return true;
  }
  return false;
}

}  // namespace cachealloc::analyzer::whatif
