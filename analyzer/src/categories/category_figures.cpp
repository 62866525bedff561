// Bytes per category at chosen moments: one walk of the trace's changes
// through a Follower (the kept changes, or a replay of the source).
#include <algorithm>

#include "cachealloc/analyzer/categories.hpp"

namespace cachealloc::analyzer {

// Calls visit(follower) once the start state is applied (index kNoEvent),
// then after each event; visit returns false to stop.
template <class Visit>
void Categorization::follow(Visit&& visit) const {
  Follower follower(*this);
  if (!visit(follower, kNoEvent)) return;
  if (source_ == nullptr) return;
  if (kept_) {
    // The kept changes alone: no event needs reading.
    snapshot::Event none;
    for (const Kept& k : kept_changes_) {
      if (k.event == kNoEvent) continue;
      follower.on_event(k.event, none);
      if (!visit(follower, k.event)) return;
    }
    return;
  }
  for_each_event(*source_, 0, source_->event_count(), [&](std::size_t i, const snapshot::Event& e) {
    follower.on_event(i, e);
    return visit(follower, i);
  });
}

// The state after event X is the one after the last moment visited at or
// before X: the kept changes visit only the events that made one.
std::vector<CategoryBytes> Categorization::at(const std::vector<std::size_t>& events) const {
  std::vector<CategoryBytes> out;
  out.reserve(events.size());
  // Moments the walk summed already.
  for (const std::size_t event : events) {
    const auto found = std::find_if(moments_.begin(), moments_.end(), [&](const Moment& m) { return m.event == event; });
    if (found == moments_.end()) break;
    out.push_back(found->bytes);
  }
  if (out.size() == events.size()) return out;
  out.clear();
  CategoryBytes previous;  // the state before the moment being visited
  follow([&](const Follower& f, std::size_t index) {
    if (index == kNoEvent) {
      while (out.size() < events.size() && events[out.size()] == kNoEvent) out.push_back(f.now());
    } else {
      while (out.size() < events.size() && events[out.size()] < index) out.push_back(previous);
      while (out.size() < events.size() && events[out.size()] == index) out.push_back(f.now());
    }
    previous = f.now();
    return out.size() < events.size();
  });
  while (out.size() < events.size()) out.push_back(previous);
  return out;
}

std::vector<CategoryBytes> Categorization::at_allocated_max(
    const std::vector<std::pair<std::size_t, std::size_t>>& ranges) const {
  if (!summed_ranges_.empty() && ranges == summed_ranges_) return range_bytes_;  // summed by the walk
  std::vector<CategoryBytes> out(ranges.size());
  std::size_t r = 0;
  bool open = false;  // out[r] holds the state after ranges[r].first, or a larger one of the range
  std::uint64_t best = 0;
  CategoryBytes previous;  // the state before the moment being visited
  std::uint64_t previous_total = 0;
  follow([&](const Follower& f, std::size_t index) {
    if (index == kNoEvent) {
      while (r < ranges.size() && ranges[r].second == kNoEvent) out[r++] = f.now();
    } else {
      while (r < ranges.size()) {
        const auto [first, last] = ranges[r];
        if (!open) {
          if (first > index) break;  // the range begins later
          open = true;
          if (first == index) {
            out[r] = f.now(), best = f.total();
            if (last > index) break;
            ++r, open = false;
            continue;
          }
          out[r] = previous, best = previous_total;  // nothing changed at `first`
        }
        if (index > last) {  // the range ended before this moment
          ++r, open = false;
          continue;
        }
        if (f.total() > best) out[r] = f.now(), best = f.total();
        if (index < last) break;
        ++r, open = false;
      }
    }
    previous = f.now(), previous_total = f.total();
    return r < ranges.size();
  });
  // Ranges past the last change hold the final state.
  for (; r < ranges.size(); ++r, open = false)
    if (!open) out[r] = previous;
  return out;
}

CategoryBytes Categorization::peaks() const {
  CategoryBytes best;
  follow([&](const Follower& f, std::size_t) {
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      best.bytes[c] = std::max(best.bytes[c], f.now().bytes[c]);
      best.requested[c] = std::max(best.requested[c], f.now().requested[c]);
    }
    return true;
  });
  return best;
}

std::vector<CategorizedAllocation> Categorization::allocations() const {
  std::vector<CategorizedAllocation> out(count_);
  const auto record = [&](const CategoryChange& change) {
    CategorizedAllocation& a = out[change.allocation];
    a.bytes = change.bytes;
    a.requested = change.requested;
    a.category = change.category;
    if (change.freed) {
      a.free_event = change.event;
    } else {
      a.alloc_event = change.event;
      a.stack = change.stack;
    }
  };
  follow([&](const Follower& f, std::size_t index) {
    if (index == kNoEvent) {
      for (const CategoryChange& change : f.start()) record(change);
    } else if (const CategoryChange* change = f.change()) {
      record(*change);
    }
    return true;
  });
  return out;
}

}  // namespace cachealloc::analyzer
