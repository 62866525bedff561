// The allocations live at a peak, kept during the analysis pass
// (AnalysisOptions::live_at_peak) so that the peak report lists them without
// replaying the events up to the peak a second time. Private to analyzer/src.
//
// Like SitePeakTracker, it copies nothing at each new maximum: it holds the
// live set at the last peak and the addresses whose allocation changed
// since (an alloc or a free changes only the block at its address, unless
// the trace is damaged: ReplayAnomalies), and a new peak refreshes those
// addresses alone from the replay. Cost: one hash probe per alloc and free,
// and one per address touched between two peaks; memory: the live set at
// the peak and the addresses touched since.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cachealloc/analyzer/detail/flat_hash.hpp"
#include "core/replay_hot.hpp"

namespace cachealloc::analyzer::pass {

class PeakLiveSet {
 public:
  // The state now is the peak (the window's start).
  void start(const Replay& replay) {
    *this = PeakLiveSet{};
    replay.for_each_allocated([&](const Replay::LiveBlock& block) {
      Slot& slot = slots_[slot_for(block.address)];
      slot.block = block;
      slot.at_peak = true;
      bytes_ += block.size;
    });
    check(replay);
  }

  // The event just applied changed the allocation at `address`.
  void touch(std::uint64_t address) {
    const std::uint32_t id = slot_for(address);
    if (slots_[id].touched) return;
    slots_[id].touched = true;
    touched_.push_back(id);
  }

  // The state now is the peak.
  void new_peak(const Replay& replay) {
    for (const std::uint32_t id : touched_) {
      Slot& slot = slots_[id];
      slot.touched = false;
      if (slot.at_peak) bytes_ -= slot.block.size;
      const std::optional<Replay::LiveBlock> now = replay.allocated_at(slot.block.address);
      slot.at_peak = now.has_value();
      if (now) {
        slot.block = *now;
        bytes_ += now->size;
      } else {
        index_.erase(slot.block.address);
        free_.push_back(id);
      }
    }
    touched_.clear();
    check(replay);
  }

  // Whether the set held the replay's allocated bytes at every peak.
  bool consistent() const noexcept { return consistent_; }

  // The allocations live at the last peak, in no order.
  std::vector<Replay::LiveBlock> blocks() const {
    std::vector<Replay::LiveBlock> result;
    for (const Slot& slot : slots_)
      if (slot.at_peak) result.push_back(slot.block);
    return result;
  }

 private:
  struct Slot {
    Replay::LiveBlock block{};  // its address, always; the rest while at_peak
    bool at_peak = false;       // allocated at the last peak
    bool touched = false;       // in touched_
  };

  std::uint32_t slot_for(std::uint64_t address) {
    std::uint32_t id = index_.find(address);
    if (id != detail::FlatHashMap::kMissing) return id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
      slots_[id] = Slot{};
    } else {
      id = static_cast<std::uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    slots_[id].block.address = address;
    index_.insert(address, id);
    return id;
  }

  void check(const Replay& replay) noexcept { consistent_ = consistent_ && bytes_ == replay.totals().allocated; }

  detail::FlatHashMap index_;  // address -> slot
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_;
  std::vector<std::uint32_t> touched_;
  std::uint64_t bytes_ = 0;  // of the slots at_peak
  bool consistent_ = true;
};

}  // namespace cachealloc::analyzer::pass
