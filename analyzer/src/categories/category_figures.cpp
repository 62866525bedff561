// Bytes per category at chosen moments: one ordered walk of the changes
// categorize() recorded.
#include <algorithm>

#include "cachealloc/analyzer/categories.hpp"

namespace cachealloc::analyzer {

using ChangeWalk = Categorization::Cursor;

const CategoryBytes& Categorization::Cursor::through(std::size_t event) {
  while (next_ < c_.changes.size()) {
    const Change& change = c_.changes[next_];
    if (change.event != kNoEvent && (event == kNoEvent || change.event > event)) break;
    apply();
  }
  return now_;
}

bool Categorization::Cursor::step(std::size_t last) {
  if (next_ >= c_.changes.size() || c_.changes[next_].event > last) return false;
  apply();
  return true;
}

void Categorization::Cursor::apply() {
  const Change& change = c_.changes[next_++];
  const CategorizedAllocation& a = c_.allocations[change.allocation];
  if (change.freed) now_[a.category.category] -= a.bytes, total_ -= a.bytes;
  else now_[a.category.category] += a.bytes, total_ += a.bytes;
}

bool Categorization::any_inferred() const noexcept {
  for (const CategorizedAllocation& a : allocations)
    if (a.category.source == CategorySource::inferred) return true;
  return allocations.empty();
}

std::vector<CategoryBytes> Categorization::at(const std::vector<std::size_t>& events) const {
  std::vector<CategoryBytes> out;
  out.reserve(events.size());
  ChangeWalk walk(*this);
  for (const std::size_t event : events) {
    walk.through(event);
    out.push_back(walk.now());
  }
  return out;
}

std::vector<CategoryBytes> Categorization::at_allocated_max(
    const std::vector<std::pair<std::size_t, std::size_t>>& ranges) const {
  std::vector<CategoryBytes> out;
  out.reserve(ranges.size());
  ChangeWalk walk(*this);
  for (const auto& [first, last] : ranges) {
    if (last == kNoEvent) {
      walk.through(kNoEvent);
      out.push_back(walk.now());
      continue;
    }
    // The state after `first`, then after each later change of the range.
    walk.through(first);
    CategoryBytes best = walk.now();
    std::uint64_t best_total = walk.total();
    while (walk.step(last)) {
      if (walk.total() > best_total) best = walk.now(), best_total = walk.total();
    }
    out.push_back(best);
  }
  return out;
}

CategoryBytes Categorization::peaks() const {
  CategoryBytes best;
  ChangeWalk walk(*this);
  const auto keep = [&] {
    for (std::size_t c = 0; c < kCategoryCount; ++c) best.bytes[c] = std::max(best.bytes[c], walk.now().bytes[c]);
  };
  walk.through(kNoEvent);
  keep();
  while (walk.step(kNoEvent)) keep();
  return best;
}

}  // namespace cachealloc::analyzer
