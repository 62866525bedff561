// categorize()'s walk inside the analysis pass (analysis.cpp): it follows
// the analysis's own replay instead of replaying the events again, so that a
// report of a long trace that shows categories (summary, timeline) reads its
// events once. It sums the categories at the allocated peak, at the end and
// at the allocated maximum of each timeline row, as categorize() sums
// CategorizeOptions::moments and allocated_max_ranges. Private to
// analyzer/src.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "cachealloc/analyzer/categories.hpp"
#include "cachealloc/snapshot/model.hpp"
#include "categories/category_walk.hpp"

namespace cachealloc::analyzer::categories {

class SharedWalk {
 public:
  // `replay`: the analysis's, in the state before the first event, from
  // which it applies every event of `source` in order between before() and
  // after() of each.
  // `keep_changes`: AnalysisOptions::category_changes.
  SharedWalk(EventSource& source, std::int32_t device, Replay& replay, bool keep_changes = true);
  ~SharedWalk();
  SharedWalk(const SharedWalk&) = delete;
  SharedWalk& operator=(const SharedWalk&) = delete;

  // Inline, the walk's own calls too (category_walk.hpp): a split or a merge (a third of a trace) changes nothing the walk sees
  // (neither allocated nor what precedes an alloc), and after an event that
  // changed nothing the walk's sums need no look unless a timeline row just
  // ended (the next event opens the next row).
  void before(std::size_t i, const snapshot::Event& e) {
    if (e.kind == snapshot::EventKind::split || e.kind == snapshot::EventKind::merge) return;
    follows_ = walk_.before(i, e);
  }
  // After the replay applied event i, and after the timeline row that ends
  // before it ended (row_ends).
  void after(std::size_t i, const snapshot::Event& e) {
    if (!follows_ && !row_ended_) return;
    if (follows_) walk_.applied(i, e);
    follows_ = row_ended_ = false;
    walk_.track(i);
  }
  // The timeline's row before the first event.
  void start_row();
  // The timeline row open ends after the last event given.
  void row_ends();

  // After the last event: `a`'s peak, end and timeline rows with their
  // categories summed (Categorization::at and at_allocated_max of them need
  // no walk, unless the trace freed what it never made). `start`: the
  // state the replay began from.
  std::shared_ptr<const Categorization> finish(const Analysis& a, std::shared_ptr<const InitialLayout> start);

 private:
  EventSource& source_;
  std::unique_ptr<const AllocatorConfig> config_;  // the walk keeps a reference to it
  CategoryWalk walk_;
  bool follows_ = false;    // the walk follows the event between before() and after()
  bool row_ended_ = false;  // since the walk's last look
};

}  // namespace cachealloc::analyzer::categories
