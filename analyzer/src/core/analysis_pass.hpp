// The per-event work of analyze() over one stretch of the window, shared by
// the serial analysis (analysis.cpp: one pass over the whole window) and the
// parallel one (analysis_parallel.cpp: one pass per range of events, merged).
// Private to analyzer/src.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cachealloc/analyzer/analysis.hpp"
#include "categories/shared_walk.hpp"
#include "core/peak_live_set.hpp"
#include "core/replay_hot.hpp"

namespace cachealloc::analyzer::pass {

using snapshot::Event;
using snapshot::EventKind;

// Tracks per-site bytes at the moment of one peak without copying the live
// set at every new maximum: only sites touched since the last maximum are
// refreshed. Invariant: at_peak[s] == live[s] for every s not in `touched`.
class SitePeakTracker {
 public:
  void start(const Replay& replay) {
    bytes_ = replay.live_bytes_by_stack();
    blocks_ = replay.live_blocks_by_stack();
    touched_flag_.assign(bytes_.size(), 0);
  }
  // Inline: most events touch a site already touched since the last peak.
  void touch(snapshot::StackId stack) {
    if (stack.value < touched_flag_.size() && touched_flag_[stack.value]) [[likely]]
      return;
    first_touch(stack);
  }
  void new_peak(const Replay& replay) {
    const auto& live_bytes = replay.live_bytes_by_stack();
    const auto& live_blocks = replay.live_blocks_by_stack();
    for (std::uint32_t s : touched_) {
      bytes_[s] = s < live_bytes.size() ? live_bytes[s] : 0;
      blocks_[s] = s < live_blocks.size() ? live_blocks[s] : 0;
      touched_flag_[s] = 0;
    }
    touched_.clear();
  }
  const std::vector<std::uint64_t>& bytes() const { return bytes_; }
  const std::vector<std::uint32_t>& blocks() const { return blocks_; }

 private:
  [[gnu::noinline]] void first_touch(snapshot::StackId stack) {
    if (stack.value >= touched_flag_.size()) {
      touched_flag_.resize(stack.value + 1, 0);
      bytes_.resize(stack.value + 1, 0);
      blocks_.resize(stack.value + 1, 0);
    }
    if (!touched_flag_[stack.value]) {
      touched_flag_[stack.value] = 1;
      touched_.push_back(stack.value);
    }
  }

  std::vector<std::uint64_t> bytes_;
  std::vector<std::uint32_t> blocks_;
  std::vector<std::uint8_t> touched_flag_;
  std::vector<std::uint32_t> touched_;
};

inline void record_peak(Peak& peak, std::uint64_t bytes, std::size_t event, std::uint64_t time_ns, const Replay& replay) {
  peak.bytes = bytes;
  peak.event = event;
  peak.time_ns = time_ns;
  peak.phase.assign(replay.open_annotations().begin(), replay.open_annotations().end());
}

inline void grow_max(Totals& max, const Totals& now) {
  max.allocated = std::max(max.allocated, now.allocated);
  max.requested = std::max(max.requested, now.requested);
  max.active = std::max(max.active, now.active);
  max.reserved = std::max(max.reserved, now.reserved);
  max.inactive_split = std::max(max.inactive_split, now.inactive_split);
  max.segments = std::max(max.segments, now.segments);
}

// Whether replaying the event can change Replay::totals(): split, merge and
// the purely informative kinds never do, and make up a third of a trace.
inline bool may_change_totals(EventKind kind) {
  constexpr unsigned kChanging = (1u << static_cast<unsigned>(EventKind::alloc)) |
                                 (1u << static_cast<unsigned>(EventKind::free_requested)) |
                                 (1u << static_cast<unsigned>(EventKind::free_completed)) |
                                 (1u << static_cast<unsigned>(EventKind::segment_alloc)) |
                                 (1u << static_cast<unsigned>(EventKind::segment_release)) |
                                 (1u << static_cast<unsigned>(EventKind::segment_map)) |
                                 (1u << static_cast<unsigned>(EventKind::segment_unmap));
  const auto bit = static_cast<unsigned>(kind);
  return bit < 32 && ((kChanging >> bit) & 1u) != 0;
}

inline bool counts_for(const Event& event, std::int32_t device) {
  return event.device == device || event.kind == EventKind::annotation_begin ||
         event.kind == EventKind::annotation_end;
}


// One pass of the analysis over consecutive events of the window, on one
// Replay. It fills its own Analysis: counts, peaks (with their sites), OOMs,
// per-site alloc figures and timeline rows. A pass that starts at the
// window's start (start_window) is the whole serial analysis; one that starts
// later (start_range) holds the figures of its range only: its peaks are
// reached only above the state it started from (event kNoEvent otherwise),
// and its first and last timeline rows may be parts of a row that other
// passes continue (row_complete).
class WindowPass {
 public:
  WindowPass(const AnalysisOptions& options, Analysis& a, Replay& replay) : options_(options), a_(a), replay_(replay) {
    per_event_ = options.timeline == AnalysisOptions::Timeline::per_event;
    window_size_ = a.window.end - a.window.begin;
    buckets_ = options.timeline == AnalysisOptions::Timeline::buckets
                   ? std::max<std::size_t>(1, std::min(options.buckets, std::max<std::size_t>(window_size_, 1)))
                   : 0;
    bucket_end_ = buckets_ ? a.window.begin + window_size_ / buckets_ : 0;
    row_.first_event = a.window.begin;
    live_at_peak_ = options.live_at_peak;
  }

  // The categories walk follows this pass's replay (serial, whole trace
  // only): it hears of every event and every timeline row.
  void share_replay_with(categories::SharedWalk* walk) noexcept { walk_ = walk; }

  // The state at the window's start; `start_time` is the time of its first
  // event, or of events[0] when the window starts past the end.
  void start_window(std::uint64_t start_time) {
    a_.totals_at_start = replay_.totals();
    a_.cache_at_start = replay_.cache_figures();
    a_.cache_at_peak_reserved = replay_.cache_figures(true);
    start_peaks(a_.totals_at_start, kNoEvent, start_time);
    if (options_.timeline != AnalysisOptions::Timeline::none) {
      TimelineRow start;
      start.time_ns = start_time;
      start.at_end = start.max = a_.totals_at_start;
      if (options_.sample_fragmentation) start.cache = a_.cache_at_start;
      a_.timeline.reserve(per_event_ ? window_size_ + 1 : buckets_ + 1);
      a_.timeline.push_back(start);
      row_complete_.push_back(1);
      if (walk_ != nullptr) walk_->start_row();
    }
  }

  // A pass over a range that starts at event `first`, inside the window and
  // after its start: peaks count only above the state now.
  // `completes_previous`: the event before `first` is a free that waited for
  // no stream and `first` its completion (plain_free_pair), so `first` ends
  // the row the previous range left open.
  void start_range(std::size_t first, bool completes_previous) {
    start_peaks(replay_.totals(), kNoEvent, 0);
    if (buckets_) {
      bucket_ = (first - a_.window.begin) * buckets_ / window_size_;
      while (bucket_ > 0 && row_end(bucket_ - 1) > first) --bucket_;
      while (row_end(bucket_) <= first) ++bucket_;
      bucket_end_ = row_end(bucket_);
      if (completes_previous && bucket_ > 0 && row_end(bucket_ - 1) == first) {
        --bucket_;
        bucket_end_ = first;
      }
      row_ = TimelineRow{};
      row_.first_event = first;
    }
  }

  // A free that waited for no stream is one call in PyTorch: its
  // free_requested and free_completed are consecutive, and no state lies
  // between them. A timeline row that would end between the two ends after
  // both, as --to and --at do (parse_state_end).
  static bool plain_free_pair(const Event& requested, const Event& completed, std::int32_t device) {
    return requested.kind == EventKind::free_requested && requested.device == device &&
           completed.kind == EventKind::free_completed && completed.device == device &&
           completed.address == requested.address;
  }

  // One event inside the window: the per-event cost of the whole tool.
  // kWalk: the categories walk follows (share_replay_with); a loop without
  // it compiles without the walk's inlined code.
  template <bool kWalk = false>
  [[gnu::always_inline]] inline void step(std::size_t i, const Event& e) {
    if (peak_cache_pending_ && e.device == a_.device && is_request(e.kind)) [[unlikely]]
      settle_peak_cache();
    if constexpr (kWalk) walk_->before(i, e);
    replay_.apply_inline(e);
    if (counts_for(e, a_.device)) {
      const auto kind = static_cast<std::size_t>(e.kind);
      if (kind < a_.counts.size()) ++a_.counts[kind];
      if (e.kind == EventKind::alloc && e.stack.value < a_.sites.size()) {
        SiteFigures& site = a_.sites[e.stack.value];
        ++site.allocs;
        site.alloc_bytes += e.size;
        site.requested_bytes += e.aux;
      } else if (e.kind == EventKind::oom && e.device == a_.device) {
        on_oom(i, e);
      }
    }
    // Totals that did not change cannot make a peak: the previous event, or
    // start_window, already compared them.
    const bool changed = may_change_totals(e.kind);
    const Totals& t = replay_.totals();
    if (changed) {
      if (const std::optional<snapshot::StackId> touched = replay_.last_touched_stack()) {
        at_peak_allocated.touch(*touched);
        at_peak_reserved.touch(*touched);
        // Only an alloc or a free changes the allocated set, at its address.
        if (live_at_peak_ != AnalysisOptions::LiveAtPeak::none) live_at_peak.touch(e.address);
      }
      if (t.allocated > a_.peak_allocated.bytes) {
        record_peak(a_.peak_allocated, t.allocated, i, e.time_ns, replay_);
        at_peak_allocated.new_peak(replay_);
        if (live_at_peak_ == AnalysisOptions::LiveAtPeak::allocated) live_at_peak.new_peak(replay_);
      }
      if (t.reserved > a_.peak_reserved.bytes) {
        record_peak(a_.peak_reserved, t.reserved, i, e.time_ns, replay_);
        at_peak_reserved.new_peak(replay_);
        if (live_at_peak_ == AnalysisOptions::LiveAtPeak::reserved) live_at_peak.new_peak(replay_);
        a_.cache_at_peak_reserved = replay_.cache_figures(false);
        peak_cache_pending_ = true;
        peak_call_done_ = false;
      }
      if (t.active > a_.peak_active.bytes) record_peak(a_.peak_active, t.active, i, e.time_ns, replay_);
      if (t.requested > a_.peak_requested.bytes) record_peak(a_.peak_requested, t.requested, i, e.time_ns, replay_);
      if (t.inactive_split > a_.peak_inactive_split.bytes)
        record_peak(a_.peak_inactive_split, t.inactive_split, i, e.time_ns, replay_);
      if (t.segments > a_.peak_segments) a_.peak_segments = t.segments;
    }

    // The row held open by a free_requested ends here, after the
    // completion, or as it was, before another event.
    if (held_) [[unlikely]] {
      const bool completes = completes_held(e);
      held_ = false;
      if (!completes) close_row(i);
    }
    if constexpr (kWalk) walk_->after(i, e);

    if (per_event_) {
      TimelineRow r;
      r.first_event = r.last_event = i;
      r.time_ns = e.time_ns;
      r.kind = e.kind;
      r.at_end = r.max = t;
      a_.timeline.push_back(r);
      if constexpr (kWalk) walk_->row_ends();
    } else if (buckets_) {
      if (changed || row_.first_event == i) grow_max(row_.max, t);  // a row starts from zero
      if (i + 1 >= bucket_end_) {
        row_.last_event = i;
        row_.time_ns = e.time_ns;
        row_.kind = e.kind;
        row_.at_end = t;
        if (options_.sample_fragmentation) row_.cache = replay_.cache_figures();
        if (e.kind == EventKind::free_requested && e.device == a_.device) {
          held_ = true;
          held_address_ = e.address;
        } else {
          close_row(i + 1);
        }
      }
    }
  }

  // A range that ends at `end`, before the window's end: the row it was
  // filling goes to the timeline unfinished, for the next pass to continue.
  // `next` is the event at `end`: the completion of a free that ends this
  // range leaves its row open for the next range (start_range).
  void end_range(std::size_t end, const Event& next) {
    if (buckets_ && held_) {
      a_.timeline.push_back(row_);
      row_complete_.push_back(completes_held(next) ? 0 : 1);
      held_ = false;
    } else if (buckets_ && row_.first_event < end) {
      a_.timeline.push_back(row_);
      row_complete_.push_back(0);
    }
  }

  // After the window's last event: a row held open for a completion past
  // the window ends as it is.
  void end_window() {
    if (held_) close_row(row_.last_event + 1);
    held_ = false;
  }

  // The largest free block at the reserved peak is taken after the call that
  // reached the peak, at the next request (see step). Past the pass's own
  // events: applies `e` (the next event) and returns whether that is still
  // to come.
  bool peak_cache_pending() const noexcept { return peak_cache_pending_; }
  bool settle_with(const Event& e) {
    if (e.device == a_.device && is_request(e.kind)) settle_peak_cache();
    if (!peak_cache_pending_) return false;
    replay_.apply_inline(e);
    return true;
  }
  // At the window's end: the state now, when no request came after the peak.
  void finish() {
    if (peak_cache_pending_) a_.cache_at_peak_reserved = replay_.cache_figures(true);
    peak_cache_pending_ = false;
  }

  // Whether each row of the Analysis's timeline is whole (1) or a part that
  // the next range's pass continues (0).
  const std::vector<std::uint8_t>& row_complete() const noexcept { return row_complete_; }

  SitePeakTracker at_peak_allocated;
  SitePeakTracker at_peak_reserved;
  // AnalysisOptions::live_at_peak's peak, when asked for.
  PeakLiveSet live_at_peak;

 private:
  static bool is_request(EventKind kind) {
    return kind == EventKind::alloc || kind == EventKind::oom || kind == EventKind::free_requested ||
           kind == EventKind::empty_cache;
  }
  std::size_t row_end(std::size_t bucket) const { return a_.window.begin + (window_size_ * (bucket + 1)) / buckets_; }

  bool completes_held(const Event& e) const noexcept {
    return held_ && e.kind == EventKind::free_completed && e.device == a_.device && e.address == held_address_;
  }

  // The row ends; the next starts at event `next_first`. A bucket left empty
  // because its first event ended the row before (a completion) has no row.
  void close_row(std::size_t next_first) {
    a_.timeline.push_back(row_);
    if (walk_ != nullptr) walk_->row_ends();
    row_complete_.push_back(1);
    ++bucket_;
    bucket_end_ = row_end(bucket_);
    while (bucket_ + 1 < buckets_ && bucket_end_ <= next_first) bucket_end_ = row_end(++bucket_);
    row_ = TimelineRow{};
    row_.first_event = next_first;
  }

  void start_peaks(const Totals& t, std::size_t event, std::uint64_t time) {
    record_peak(a_.peak_allocated, t.allocated, event, time, replay_);
    record_peak(a_.peak_reserved, t.reserved, event, time, replay_);
    record_peak(a_.peak_active, t.active, event, time, replay_);
    record_peak(a_.peak_requested, t.requested, event, time, replay_);
    record_peak(a_.peak_inactive_split, t.inactive_split, event, time, replay_);
    a_.peak_segments = t.segments;
    at_peak_allocated.start(replay_);
    at_peak_reserved.start(replay_);
    if (live_at_peak_ != AnalysisOptions::LiveAtPeak::none) live_at_peak.start(replay_);
  }

  [[gnu::noinline]] void settle_peak_cache() {
    if (peak_call_done_) {
      a_.cache_at_peak_reserved = replay_.cache_figures(true);
      peak_cache_pending_ = false;
    } else {
      peak_call_done_ = true;
    }
  }

  [[gnu::noinline]] void on_oom(std::size_t i, const Event& e) {
    OomRecord oom{i, e.time_ns, replay_.open_annotations(), e.size, e.address, e.aux, replay_.totals(),
                  replay_.cache_figures(), {}};
    const auto& live = replay_.live_bytes_by_stack();
    const auto& blocks = replay_.live_blocks_by_stack();
    for (std::uint32_t s = 0; s < live.size(); ++s) {
      if (live[s] != 0) oom.top_sites.push_back(SiteBytes{snapshot::StackId{s}, live[s], blocks[s]});
    }
    const std::size_t keep = std::min(options_.oom_sites, oom.top_sites.size());
    std::partial_sort(oom.top_sites.begin(), oom.top_sites.begin() + static_cast<std::ptrdiff_t>(keep),
                      oom.top_sites.end(), [](const SiteBytes& x, const SiteBytes& y) {
                        return x.bytes != y.bytes ? x.bytes > y.bytes : x.stack < y.stack;
                      });
    oom.top_sites.resize(keep);
    a_.ooms.push_back(std::move(oom));
  }

  const AnalysisOptions& options_;
  Analysis& a_;
  Replay& replay_;
  categories::SharedWalk* walk_ = nullptr;
  AnalysisOptions::LiveAtPeak live_at_peak_ = AnalysisOptions::LiveAtPeak::none;
  bool per_event_ = false;
  std::size_t window_size_ = 0;
  std::size_t buckets_ = 0;
  std::size_t bucket_ = 0;
  std::size_t bucket_end_ = 0;
  TimelineRow row_;
  std::vector<std::uint8_t> row_complete_;
  bool held_ = false;  // the row is done but for a free's completion (step)
  std::uint64_t held_address_ = 0;
  bool peak_cache_pending_ = false;
  bool peak_call_done_ = false;
};

}  // namespace cachealloc::analyzer::pass
