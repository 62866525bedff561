// categorize(): one replay of the device's events that follows the phase of
// each event and how each allocation lives, and applies the rules
// (category_rules.cpp) to an allocation when the trace frees it, or at the
// end, unless a category event tagged it while live: then it takes the
// last tag, exact. Only the allocations alive at a moment are held, with what the rules
// need of them; each allocation's category is half a byte.
#include <optional>

#include "cachealloc/analyzer/allocator_replay.hpp"
#include "cachealloc/analyzer/categories.hpp"
#include "categories/category_walk.hpp"
#include "categories/shared_walk.hpp"

namespace cachealloc::analyzer {

using snapshot::Event;

Categorization categorize(EventSource& source, std::int32_t device, const CategorizeOptions& options) {
  const snapshot::Snapshot& head = source.head();
  device = pick_device(source, device);
  std::shared_ptr<const InitialLayout> initial = options.start && options.start->device == device
                                                     ? options.start
                                                     : std::make_shared<const InitialLayout>(confirmed_start(source, device));
  bool known = false;
  const AllocatorConfig config = recorded_settings(head, known);
  CategoryWalk walk(head, device, *initial, config, options);
  for_each_event(source, 0, source.event_count(), [&](std::size_t i, const Event& e) {
    walk.on_event(i, e);
    walk.after(i);
    return true;
  });
  Categorization result = walk.finish();
  result.source_ = &source;
  result.start_ = std::move(initial);
  result.sizes_inferred_ = Replay::sizes_may_be_inferred(head, device);
  return result;
}

namespace categories {

namespace {
AllocatorConfig recorded_config(const snapshot::Snapshot& head) {
  bool known = false;
  return recorded_settings(head, known);
}
}  // namespace

// The replay's state now is the start: the walk reads it, and keeps no copy.
namespace {
CategorizeOptions shared_walk_options(bool keep_changes) {
  CategorizeOptions options;
  if (!keep_changes) options.max_kept_changes = 0;
  return options;
}
}  // namespace

SharedWalk::SharedWalk(EventSource& source, std::int32_t device, Replay& replay, bool keep_changes)
    : source_(source),
      config_(std::make_unique<const AllocatorConfig>(recorded_config(source.head()))),
      walk_(source.head(), device, InitialLayout{}, *config_, shared_walk_options(keep_changes), &replay) {}

SharedWalk::~SharedWalk() = default;

void SharedWalk::start_row() {
  walk_.start_row();
  row_ended_ = true;
}
void SharedWalk::row_ends() {
  walk_.row_ends();
  row_ended_ = true;
}

std::shared_ptr<const Categorization> SharedWalk::finish(const Analysis& a, std::shared_ptr<const InitialLayout> start) {
  std::vector<std::pair<std::size_t, std::size_t>> rows;
  rows.reserve(a.timeline.size());
  for (const TimelineRow& row : a.timeline) {
    if (row.last_event == kNoEvent) rows.emplace_back(kNoEvent, kNoEvent);
    else rows.emplace_back(row.first_event, row.last_event);
  }
  const std::size_t end_event = a.event_count == 0 ? kNoEvent : a.event_count - 1;
  return std::make_shared<const Categorization>(
      walk_.finish_shared(a.peak_allocated.event, end_event, std::move(rows), source_, std::move(start)));
}

}  // namespace categories

}  // namespace cachealloc::analyzer
