// categorize(): one replay of the device's events that follows the phase of
// each event, records each allocation's change to allocated and how it
// lived, then applies the rules (category_rules.cpp) once the whole trace
// has said when each allocation was freed.
#include <unordered_map>
#include <unordered_set>

#include "cachealloc/analyzer/allocator_replay.hpp"
#include "cachealloc/analyzer/categories.hpp"
#include "categories/category_rules.hpp"
#include "categories/phases.hpp"
#include "whatif/replay_parts.hpp"

namespace cachealloc::analyzer {

using categories::FrameEvidenceCache;
using categories::Lifetime;
using categories::Phase;
using categories::PhaseTracker;
using snapshot::Event;
using snapshot::EventKind;

namespace {

std::string_view annotation_name(const snapshot::Snapshot& head, const Event& e) {
  return e.aux < head.strings.size() ? std::string_view(head.strings[e.aux]) : std::string_view();
}

class CategoryWalk {
 public:
  CategoryWalk(const snapshot::Snapshot& head, std::int32_t device, const InitialLayout& initial,
               const AllocatorConfig& config)
      : head_(head),
        device_(device),
        evidence_(head),
        engine_(initial.segments, device, head.stacks.size(), Replay::sizes_may_be_inferred(head)),
        pools_(config) {
    result_.device = device;
    // Blocks alive before the first event: categorized by their stacks alone.
    engine_.for_each_allocated([&](const Replay::LiveBlock& block) {
      Lifetime life;
      life.evidence = evidence_.of(block.stack);
      life.made_in = life.evidence.phase;
      life.known_start = false;
      live_[block.address] = add(kNoEvent, block.size, block.stack, life);
      result_.changes.push_back({kNoEvent, static_cast<std::uint32_t>(result_.allocations.size() - 1), false});
    });
  }

  void on_event(std::size_t i, const Event& e) {
    if (e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end) {
      const Phase phase = categories::phase_of_annotation(annotation_name(head_, e));
      if (e.kind == EventKind::annotation_begin) phases_.annotation_begin(phase);
      else phases_.annotation_end(phase);
      engine_.apply(e);
      return;
    }
    if (e.device != device_ || e.kind == EventKind::snapshot) return;
    if (says_where(e)) phases_.observe(evidence_.of(e.stack));
    if (e.kind != EventKind::split && e.kind != EventKind::merge) pools_.before(i, e, engine_);
    const std::uint64_t before = engine_.totals().allocated;
    engine_.apply(e);
    const std::uint64_t after = engine_.totals().allocated;
    if (after > before) grew(i, e, after - before);
    else if (after < before) shrank(i, e, before - after);
  }

  // Whether the event's stack is where it ran. A free that repeats its
  // block's stack (a recorder that keeps no stack on free) says nothing of
  // when it ran; a free_completed repeats its free_requested.
  bool says_where(const Event& e) const {
    if (!e.stack) return false;
    switch (e.kind) {
      case EventKind::alloc:
      case EventKind::segment_alloc:
      case EventKind::segment_map: return true;
      case EventKind::free_requested: {
        const auto it = live_.find(e.address);
        return it == live_.end() || result_.allocations[it->second].stack != e.stack;
      }
      default: return false;
    }
  }

  Categorization finish() {
    std::unordered_set<std::uint64_t> parameter_sizes;
    for (std::size_t a = 0; a < result_.allocations.size(); ++a)
      if (lifetimes_[a].evidence.parameter) parameter_sizes.insert(result_.allocations[a].bytes);
    std::size_t route = 0;
    const auto& routes = pools_.routes;
    for (std::size_t a = 0; a < result_.allocations.size(); ++a) {
      CategorizedAllocation& allocation = result_.allocations[a];
      Lifetime& life = lifetimes_[a];
      // Routes are in event order, as the allocations made in the walk are.
      while (allocation.alloc_event != kNoEvent && route < routes.size() && routes[route].event < allocation.alloc_event)
        ++route;
      life.private_pool = allocation.alloc_event != kNoEvent && route < routes.size() &&
                          routes[route].event == allocation.alloc_event;
      life.parameter_sized = parameter_sizes.empty() || parameter_sizes.contains(allocation.bytes);
      allocation.category = {categories::infer_category(life), CategorySource::inferred};
    }
    return std::move(result_);
  }

 private:
  std::uint32_t add(std::size_t event, std::uint64_t bytes, snapshot::StackId stack, const Lifetime& life) {
    result_.allocations.push_back({event, kNoEvent, bytes, stack, {}});
    lifetimes_.push_back(life);
    return static_cast<std::uint32_t>(result_.allocations.size() - 1);
  }

  void grew(std::size_t i, const Event& e, std::uint64_t bytes) {
    Lifetime life;
    life.evidence = evidence_.of(e.stack);
    life.made_in = phases_.phase();
    life.made_instance = phases_.instance();
    const std::uint32_t id = add(i, bytes, e.stack, life);
    result_.changes.push_back({i, id, false});
    if (e.kind == EventKind::alloc) live_[e.address] = id;
  }

  void shrank(std::size_t i, const Event& e, std::uint64_t bytes) {
    const auto it = live_.find(e.address);
    std::uint32_t id;
    if (it != live_.end() && result_.allocations[it->second].bytes == bytes) {
      id = it->second;
      live_.erase(it);
    } else {
      // allocated fell by bytes no recorded allocation holds (a damaged
      // trace the replay still followed): an allocation of its own, so that
      // the sums stay the replay's.
      Lifetime life;
      life.known_start = false;
      id = add(kNoEvent, bytes, {}, life);
      result_.changes.insert(result_.changes.begin(), {kNoEvent, id, false});
    }
    result_.allocations[id].free_event = i;
    Lifetime& life = lifetimes_[id];
    life.freed = true;
    life.freed_in = phases_.phase();
    life.freed_instance = phases_.instance();
    result_.changes.push_back({i, id, true});
  }

  const snapshot::Snapshot& head_;
  std::int32_t device_;
  FrameEvidenceCache evidence_;
  PhaseTracker phases_;
  Replay engine_;
  whatif::PoolInference pools_;
  Categorization result_;
  std::vector<Lifetime> lifetimes_;
  std::unordered_map<std::uint64_t, std::uint32_t> live_;  // address -> allocation
};

}  // namespace

Categorization categorize(EventSource& source, std::int32_t device) {
  const snapshot::Snapshot& head = source.head();
  device = pick_device(source, device);
  const InitialLayout initial = confirmed_start(source, device);
  bool known = false;
  const AllocatorConfig config = recorded_settings(head, known);
  CategoryWalk walk(head, device, initial, config);
  for_each_event(source, 0, source.event_count(), [&](std::size_t i, const Event& e) {
    walk.on_event(i, e);
    return true;
  });
  return walk.finish();
}

}  // namespace cachealloc::analyzer
