// The replaying allocator seen from outside: its running totals (an
// AllocatorObserver) and the control a replay hook gets of it.
#include "whatif/replay_parts.hpp"

namespace cachealloc::analyzer::whatif {

using snapshot::EventKind;

void ReplayedTotals::watch(CachingAllocator& allocator) noexcept {
  allocator_ = &allocator;
  allocator.set_observer(this);
}

std::uint32_t ReplayedTotals::on_event(const AllocatorEvent& e) noexcept {
  switch (e.kind) {
    case EventKind::alloc:
      totals_.allocated += e.size;
      totals_.active += e.size;
      break;
    case EventKind::free_requested: totals_.allocated -= e.size; break;
    case EventKind::free_completed: totals_.active -= e.size; break;
    case EventKind::segment_alloc:
    case EventKind::segment_map: totals_.reserved += e.size; break;
    case EventKind::segment_release:
    case EventKind::segment_unmap: totals_.reserved -= e.size; break;
    default: break;
  }
  return 0;
}

CacheFigures ReplayedTotals::cache_figures(bool /*with_largest_free*/) const {
  CacheFigures f;
  f.cached_free = totals_.reserved > totals_.active ? totals_.reserved - totals_.active : 0;
  if (allocator_ != nullptr) f.largest_free = allocator_->largest_free_block();
  return f;
}

MemoryStats AllocatorControl::stats() const { return allocator_.stats(); }

void AllocatorControl::reset_peak_stats() { allocator_.reset_peak_stats(); }

}  // namespace cachealloc::analyzer::whatif
