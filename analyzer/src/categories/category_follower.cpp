// Categorization::Follower: the bytes per category event by event, from the
// changes categorize() kept (a short trace) or from a replay of the events
// it is given (a long one), which numbers allocations and matches frees as
// categorize()'s walk does (categorize.cpp), from the same start.
#include <unordered_map>

#include "cachealloc/analyzer/categories.hpp"

namespace cachealloc::analyzer {

using snapshot::Event;
using snapshot::EventKind;

namespace {
constexpr std::uint8_t kExactBit = 8;
}

AllocationCategory Categorization::category_of(std::size_t allocation) const noexcept {
  if (allocation >= count_) return {};
  const std::uint8_t nibble = (packed_[allocation / 2] >> (allocation % 2 * 4)) & 0xf;
  return {static_cast<Category>(nibble & 7), (nibble & kExactBit) != 0 ? CategorySource::exact : CategorySource::inferred};
}

void Categorization::set_category(std::size_t allocation, AllocationCategory category) {
  const auto nibble = static_cast<std::uint8_t>(static_cast<std::uint8_t>(category.category) |
                                                (category.source == CategorySource::exact ? kExactBit : 0));
  std::uint8_t& byte = packed_[allocation / 2];
  const int shift = allocation % 2 * 4;
  byte = static_cast<std::uint8_t>((byte & ~(0xf << shift)) | (nibble << shift));
  const auto c = static_cast<std::size_t>(category.category);
  ++count_by_category_[c];
  if (category.source == CategorySource::exact) ++exact_, ++exact_by_category_[c];
}

struct Categorization::Follower::Replayed {
  struct Live {
    std::size_t id;
    std::uint64_t bytes;
    std::uint64_t requested;
    snapshot::StackId stack;
  };
  Replayed(const Categorization& c, std::size_t stack_count)
      : engine(c.start_->segments, c.device, stack_count, c.sizes_inferred_) {}
  Replay engine;
  std::unordered_map<std::uint64_t, Live> live;  // address -> allocation
  std::size_t next_id = 0;
  std::size_t next_unmade = 0;
};

Categorization::Follower::Follower(const Categorization& categorization) : c_(categorization) {
  // Allocations the trace frees without having made them count from the start.
  for (const Unmade& u : c_.unmade_)
    start_.push_back({kNoEvent, u.allocation, u.address, u.bytes, {}, c_.category_of(u.allocation), false, u.bytes});
  if (c_.kept_) {
    while (next_kept_ < c_.kept_changes_.size() && c_.kept_changes_[next_kept_].event == kNoEvent) {
      const Kept& k = c_.kept_changes_[next_kept_++];
      start_.push_back({kNoEvent, k.allocation, k.address, k.bytes, snapshot::StackId{k.stack},
                        c_.category_of(k.allocation), false, k.requested});
    }
  } else {
    replayed_ = std::make_unique<Replayed>(c_, c_.source_->head().stacks.size());
    replayed_->engine.for_each_allocated([&](const Replay::LiveBlock& block) {
      const std::size_t id = replayed_->next_id++;
      replayed_->live[block.address] = {id, block.size, block.requested, block.stack};
      start_.push_back({kNoEvent, id, block.address, block.size, block.stack, c_.category_of(id), false, block.requested});
    });
  }
  for (const CategoryChange& change : start_) apply(change);
}

Categorization::Follower::~Follower() = default;
Categorization::Follower::Follower(Follower&&) noexcept = default;

void Categorization::Follower::apply(const CategoryChange& change) {
  const auto c = static_cast<std::size_t>(change.category.category);
  if (change.freed) {
    now_.bytes[c] -= change.bytes, now_.requested[c] -= change.requested, total_ -= change.bytes;
  } else {
    now_.bytes[c] += change.bytes, now_.requested[c] += change.requested, total_ += change.bytes;
  }
}

void Categorization::Follower::on_event(std::size_t index, const Event& e) {
  changed_ = false;
  if (!replayed_) {
    // Each event makes at most one change.
    while (next_kept_ < c_.kept_changes_.size() && c_.kept_changes_[next_kept_].event <= index) {
      const Kept& k = c_.kept_changes_[next_kept_++];
      change_ = {k.event, k.allocation, k.address, k.bytes, snapshot::StackId{k.stack}, c_.category_of(k.allocation),
                 k.freed, k.requested};
      changed_ = true;
      apply(change_);
    }
    return;
  }
  Replayed& r = *replayed_;
  if (e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end) {
    r.engine.apply(e);
    return;
  }
  if (e.device != c_.device || e.kind == EventKind::snapshot) return;
  const std::uint64_t before = r.engine.totals().allocated;
  r.engine.apply(e);
  const std::uint64_t after = r.engine.totals().allocated;
  if (after > before) {
    const std::size_t id = r.next_id++;
    // As categorize() counts it: an alloc's aux is its request.
    const std::uint64_t requested = e.kind == EventKind::alloc ? e.aux : after - before;
    if (e.kind == EventKind::alloc) r.live[e.address] = {id, after - before, requested, e.stack};
    change_ = {index, id, e.address, after - before, e.stack, c_.category_of(id), false, requested};
  } else if (after < before) {
    const std::uint64_t bytes = before - after;
    const auto it = r.live.find(e.address);
    if (it != r.live.end() && it->second.bytes == bytes) {
      change_ = {index, it->second.id, e.address, bytes, it->second.stack, c_.category_of(it->second.id), true,
                 it->second.requested};
      r.live.erase(it);
    } else {
      const std::size_t id = r.next_id++;  // one of c_.unmade_, counted from the start
      change_ = {index, id, e.address, bytes, {}, c_.category_of(id), true, bytes};
    }
  } else {
    return;
  }
  changed_ = true;
  apply(change_);
}

}  // namespace cachealloc::analyzer
