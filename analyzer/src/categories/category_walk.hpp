// CategoryWalk: categorize()'s walk (categorize.cpp), and the one that
// follows the analysis pass's replay (SharedWalk, shared_walk.hpp). In a
// header so that the analysis loop inlines its per-event calls (before(),
// applied(), track()). Private to analyzer/src.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "cachealloc/analyzer/categories.hpp"
#include "cachealloc/analyzer/replay.hpp"
#include "cachealloc/snapshot/detail/flat_map.hpp"
#include "categories/allocated_max_ranges.hpp"
#include "categories/category_rules.hpp"
#include "categories/phases.hpp"
#include "whatif/replay_parts.hpp"

namespace cachealloc::analyzer {

// The walk, a friend of Categorization. The Follower (category_follower.cpp)
// numbers allocations and matches frees exactly as this walk does, from the
// same start: keep the two in step. It replays the events itself
// (categorize()), or follows a replay that its caller applies them to
// (`shared`, in the state `initial` gives: SharedWalk, the analysis pass).
class CategoryWalk {
  using Event = snapshot::Event;
  using EventKind = snapshot::EventKind;
  using Lifetime = categories::Lifetime;
  using Phase = categories::Phase;
  using AllocatedMaxRanges = categories::AllocatedMaxRanges;
  using FrameEvidenceCache = categories::FrameEvidenceCache;
  using PhaseTracker = categories::PhaseTracker;

 public:
  CategoryWalk(const snapshot::Snapshot& head, std::int32_t device, const InitialLayout& initial,
               const AllocatorConfig& config, const CategorizeOptions& options, Replay* shared = nullptr)
      : head_(head),
        device_(device),
        evidence_(head),
        own_engine_(shared != nullptr ? std::nullopt
                                      : std::optional<Replay>(std::in_place, initial.segments, device, head.stacks.size(),
                                                              Replay::sizes_may_be_inferred(head, device))),
        engine_(shared != nullptr ? *shared : *own_engine_),
        pools_(config),
        max_kept_(options.max_kept_changes),
        moments_(options.moments),
        ranges_(options.allocated_max_ranges),
        annotation_phases_(head.strings.size(), kPhaseUnread) {
    result_.device = device;
    result_.kept_ = max_kept_ != 0;
    // Blocks alive before the first event: categorized by their stacks alone.
    engine_.for_each_allocated([&](const Replay::LiveBlock& block) {
      Lifetime life;
      life.evidence = evidence_.of(block.stack);
      life.made_in = life.evidence.phase;
      life.known_start = false;
      const std::size_t id = add(block.size, life);
      bool fresh = false;
      hold(block.address, fresh) = Live{id, block.size, block.requested, block.stack, life};
      keep({kNoEvent, id, block.address, block.size, block.stack.value, false, block.requested});
    });
    while (next_moment_ < moments_.size() && moments_[next_moment_] == kNoEvent) capture(kNoEvent);
    ranges_.start(result_.count_, engine_.totals().allocated);
    if (shared != nullptr) {
      peak_.open_now(engine_.totals().allocated, result_.count_);
    } else {
      rows_.give_up();
      peak_.give_up();
    }
  }

  // After event i: the moments it closes take the allocations alive now.
  void after(std::size_t i) {
    while (next_moment_ < moments_.size() && moments_[next_moment_] != kNoEvent && moments_[next_moment_] <= i)
      capture(moments_[next_moment_]);
    ranges_.after(i, engine_.totals().allocated, result_.count_);
  }

  void on_event(std::size_t i, const Event& e) {
    const bool follows = before(i, e);
    if (follows || e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end) engine_.apply(e);
    if (follows) applied(i, e);
  }

  // Before the replay applies event i: whether its change to allocated is
  // the walk's (then applied() after the replay applied it).
  bool before(std::size_t i, const Event& e) {
    if (e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end) {
      const Phase phase = annotation_phase(e);
      if (e.kind == EventKind::annotation_begin) phases_.annotation_begin(phase);
      else phases_.annotation_end(phase);
      return false;
    }
    if (e.device != device_ || e.kind == EventKind::snapshot) return false;
    if (e.kind == EventKind::category) {
      tag(e);
      return false;
    }
    // A free's allocation, found once for says_where() and shrank().
    if (e.kind == EventKind::free_requested) freed_slot_ = live_at_.find(e.address);
    if (says_where(e)) phases_.observe(evidence_.of(e.stack));
    routes_before_ = pools_.routes.size();
    if (e.kind != EventKind::split && e.kind != EventKind::merge) pools_.before(i, e, engine_);
    allocated_before_ = engine_.totals().allocated;
    return true;
  }
  void applied(std::size_t i, const Event& e) {
    const bool routed = pools_.routes.size() != routes_before_;
    const std::uint64_t after = engine_.totals().allocated;
    if (after > allocated_before_) grew(i, e, after - allocated_before_, routed);
    else if (after < allocated_before_) shrank(i, e, allocated_before_ - after);
  }

  // The analysis pass's sums (SharedWalk): after event i, at the allocated
  // maximum of the timeline row open and of the whole trace.
  void track(std::size_t i) {
    after(i);
    rows_.track(engine_.totals().allocated, result_.count_);
    peak_.track(engine_.totals().allocated, result_.count_);
  }
  // The row before the first event: the state now.
  void start_row() {
    rows_.open_now(engine_.totals().allocated, result_.count_);
    rows_.end_range();
  }
  void row_ends() { rows_.end_range(); }

  // Whether the event's stack is where it ran. A free that repeats its
  // block's stack (a recorder that keeps no stack on free) says nothing of
  // when it ran; a free_completed repeats its free_requested.
  bool says_where(const Event& e) const {
    if (!e.stack) return false;
    switch (e.kind) {
      case EventKind::alloc:
      case EventKind::segment_alloc:
      case EventKind::segment_map: return true;
      case EventKind::free_requested: return freed_slot_ == nullptr || live_slots_[*freed_slot_].stack != e.stack;
      default: return false;
    }
  }

  Categorization finish() {
    while (next_moment_ < moments_.size()) capture(moments_[next_moment_]);  // past the last event
    ranges_.end(result_.count_);
    peak_.end_range();
    const auto alive_at_end = [&](std::size_t id, std::uint64_t bytes, std::uint64_t requested) {
      const Category category = result_.category_of(id).category;
      ranges_.alive_at_end(id, bytes, requested, category);
      rows_.alive_at_end(id, bytes, requested, category);
      peak_.alive_at_end(id, bytes, requested, category);
      end_bytes_.bytes[static_cast<std::size_t>(category)] += bytes;
      end_bytes_.requested[static_cast<std::size_t>(category)] += requested;
    };
    for (Live& live : live_slots_) {
      if (!live.held) continue;
      settle(live.id, live.bytes, live.life, live.tag);
      alive_at_end(live.id, live.bytes, live.requested);
    }
    live_slots_.clear();
    for (const Captured& alive : forever_) alive_at_end(alive.id, alive.bytes, alive.requested);
    if (ranges_.active()) {
      result_.summed_ranges_ = ranges_.ranges();
      result_.range_bytes_ = ranges_.result();
    }
    // Each moment's sums, now that every category is settled: its live
    // allocations, and those the trace freed later without having made
    // them (alive from the start).
    for (std::size_t m = 0; m < captured_.size(); ++m) {
      Categorization::Moment moment{moments_[m], {}};
      for (const Captured& alive : captured_[m]) {
        const auto c = static_cast<std::size_t>(result_.category_of(alive.id).category);
        moment.bytes.bytes[c] += alive.bytes;
        moment.bytes.requested[c] += alive.requested;
      }
      for (const Categorization::Unmade& u : result_.unmade_) {
        if (moment.event != kNoEvent && u.freed_at <= moment.event) continue;
        const auto c = static_cast<std::size_t>(result_.category_of(u.allocation).category);
        moment.bytes.bytes[c] += u.bytes;
        moment.bytes.requested[c] += u.bytes;
      }
      result_.moments_.push_back(moment);
    }
    return std::move(result_);
  }

  // finish() of the analysis pass's walk: its allocated peak (after event
  // `peak_event`, kNoEvent: the start) and the end (after `end_event`) as
  // moments, and `rows` (the timeline's rows, in the order they ended) as
  // summed ranges, where the trace let the walk sum them.
  Categorization finish_shared(std::size_t peak_event, std::size_t end_event,
                               std::vector<std::pair<std::size_t, std::size_t>> rows, EventSource& source,
                               std::shared_ptr<const InitialLayout> start) {
    Categorization result = finish();
    result.source_ = &source;
    result.start_ = std::move(start);
    result.sizes_inferred_ = Replay::sizes_may_be_inferred(head_, device_);
    if (peak_.active()) {
      result.moments_.push_back({peak_event, peak_.result().front()});
      result.moments_.push_back({end_event, end_bytes_});
    }
    if (rows_.active() && !rows.empty()) {
      std::vector<CategoryBytes> bytes = rows_.result();
      if (bytes.size() == rows.size()) {
        result.summed_ranges_ = std::move(rows);
        result.range_bytes_ = std::move(bytes);
      }
    }
    return result;
  }

 private:
  static std::string_view annotation_name(const snapshot::Snapshot& head, const Event& e) {
    return e.aux < head.strings.size() ? std::string_view(head.strings[e.aux]) : std::string_view();
  }

  static constexpr std::uint8_t kUntagged = 0xff;
  static constexpr std::uint8_t kPhaseUnread = 0xff;

  // An annotation's phase, read once per name: a trace repeats a few names
  // millions of times.
  Phase annotation_phase(const Event& e) {
    if (e.aux >= annotation_phases_.size()) return categories::phase_of_annotation(annotation_name(head_, e));
    std::uint8_t& phase = annotation_phases_[e.aux];
    if (phase == kPhaseUnread) phase = static_cast<std::uint8_t>(categories::phase_of_annotation(annotation_name(head_, e)));
    return static_cast<Phase>(phase);
  }

  void give_up_sums() {
    ranges_.give_up();
    rows_.give_up();
    peak_.give_up();
  }

  struct Live {
    std::size_t id;
    std::uint64_t bytes;
    std::uint64_t requested;
    snapshot::StackId stack;
    Lifetime life;
    bool held = true;              // false: a free slot
    std::uint8_t tag = kUntagged;  // the last category event's code, while live
  };
  // An allocation alive at a moment, or to the end.
  struct Captured {
    std::size_t id;
    std::uint64_t bytes;
    std::uint64_t requested;
  };

  // A category event: the allocation live at its address takes its code.
  void tag(const Event& e) {
    const std::uint32_t* slot = live_at_.find(e.address);
    if (slot == nullptr || e.aux >= kCategoryCount) {
      ++result_.ignored_tags_;
      return;
    }
    live_slots_[*slot].tag = static_cast<std::uint8_t>(e.aux);
  }

  // The allocations alive now: address -> slot of live_slots_, whose free
  // slots are reused, so memory follows the live set (an unordered_map's
  // node allocation per alloc and free per free was a tenth of the walk).
  // Returns the slot to fill for an allocation at `address`; `fresh` is
  // false where the address was held already (its allocation is replaced).
  // One probe of the map.
  Live& hold(std::uint64_t address, bool& fresh) {
    const std::size_t held_before = live_at_.size();
    std::uint32_t& slot = live_at_.find_or_insert(address);
    fresh = live_at_.size() != held_before;
    if (!fresh) return live_slots_[slot];
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(live_slots_.size());
      live_slots_.emplace_back();
    }
    return live_slots_[slot];
  }
  void release(std::uint64_t address, std::uint32_t slot) {
    live_slots_[slot].held = false;
    free_slots_.push_back(slot);
    live_at_.erase(address);
  }

  void capture(std::size_t moment) {
    std::vector<Captured> alive;
    alive.reserve(live_at_.size() + forever_.size());
    for (const Live& live : live_slots_)
      if (live.held) alive.push_back({live.id, live.bytes, live.requested});
    alive.insert(alive.end(), forever_.begin(), forever_.end());
    captured_.push_back(std::move(alive));
    ++next_moment_;
    (void)moment;
  }

  std::size_t add(std::uint64_t bytes, const Lifetime& life) {
    if (life.evidence.parameter) parameter_sizes_.insert(bytes, true);
    const std::size_t id = result_.count_++;
    result_.packed_.resize((result_.count_ + 1) / 2);
    return id;
  }

  void keep(const Categorization::Kept& change) {
    if (!result_.kept_) return;
    if (result_.kept_changes_.size() >= max_kept_) {
      // Past the bound: every query replays the trace instead.
      result_.kept_ = false;
      std::vector<Categorization::Kept>().swap(result_.kept_changes_);
      return;
    }
    result_.kept_changes_.push_back(change);
  }

  // The rules, once the allocation's life is known. A size is a parameter's
  // when the frames showed a parameter of that size made before (any size,
  // while none was seen: a trace that began after the model was built).
  // A tagged allocation takes its tag instead. Returns the category.
  Category settle(std::size_t id, std::uint64_t bytes, Lifetime& life, std::uint8_t tag = kUntagged) {
    if (tag != kUntagged) {
      result_.set_category(id, {static_cast<Category>(tag), CategorySource::exact});
      return static_cast<Category>(tag);
    }
    life.parameter_sized = parameter_sizes_.size() == 0 || parameter_sizes_.find(bytes) != nullptr;
    const Category category = categories::infer_category(life);
    result_.set_category(id, {category, CategorySource::inferred});
    return category;
  }

  void grew(std::size_t i, const Event& e, std::uint64_t bytes, bool routed) {
    Lifetime life;
    life.evidence = evidence_.of(e.stack);
    life.made_in = phases_.phase();
    life.made_instance = phases_.instance();
    life.private_pool = routed;
    const std::size_t id = add(bytes, life);
    // An alloc's aux is its request; any other growth has none recorded.
    const std::uint64_t requested = e.kind == EventKind::alloc ? e.aux : bytes;
    keep({i, id, e.address, bytes, e.stack.value, false, requested});
    if (e.kind == EventKind::alloc) {
      // Filled in place, field by field: a Live built aside and copied in
      // stalled on its own stores.
      bool fresh = false;
      Live& live = hold(e.address, fresh);
      live.id = id;
      live.bytes = bytes;
      live.requested = requested;
      live.stack = e.stack;
      live.life = life;
      live.held = true;
      live.tag = kUntagged;
      // A block at an address still held (a damaged trace): the one held
      // leaves the walk unsettled, as the Follower keeps it.
      if (!fresh) give_up_sums();
    } else {
      settle(id, bytes, life);  // nothing frees it: alive to the end
      forever_.push_back({id, bytes, requested});
    }
  }

  void shrank(std::size_t i, const Event& e, std::uint64_t bytes) {
    const std::uint32_t* slot = e.kind == EventKind::free_requested ? freed_slot_ : live_at_.find(e.address);
    if (slot != nullptr && live_slots_[*slot].bytes == bytes) {
      const std::uint32_t at = *slot;
      Live& live = live_slots_[at];
      live.life.freed = true;
      live.life.freed_in = phases_.phase();
      live.life.freed_instance = phases_.instance();
      const Category category = settle(live.id, bytes, live.life, live.tag);
      ranges_.freed(live.id, bytes, live.requested, category);
      rows_.freed(live.id, bytes, live.requested, category);
      peak_.freed(live.id, bytes, live.requested, category);
      keep({i, live.id, e.address, bytes, live.stack.value, true, live.requested});
      release(e.address, at);
      return;
    }
    // allocated fell by bytes no recorded allocation holds (a damaged trace
    // the replay still followed): an allocation of its own, alive from the
    // start, so that the sums stay the replay's.
    Lifetime life;
    life.known_start = false;
    life.freed = true;
    life.freed_in = phases_.phase();
    life.freed_instance = phases_.instance();
    const std::size_t id = add(bytes, life);
    settle(id, bytes, life);
    result_.unmade_.push_back({id, e.address, bytes, i});
    give_up_sums();
    keep({i, id, e.address, bytes, 0, true, bytes});
  }

  const snapshot::Snapshot& head_;
  std::int32_t device_;
  FrameEvidenceCache evidence_;
  PhaseTracker phases_;
  std::optional<Replay> own_engine_;  // categorize()'s own replay
  Replay& engine_;
  whatif::PoolInference pools_;
  std::size_t max_kept_;
  Categorization result_;
  snapshot::detail::FlatMap<bool> parameter_sizes_;  // a set: open addressing, one probe per settle
  snapshot::detail::FlatMap<std::uint32_t, 50> live_at_;  // address -> slot
  std::vector<Live> live_slots_;
  std::vector<std::uint32_t> free_slots_;
  std::vector<Captured> forever_;  // grown by no alloc: alive to the end
  std::vector<std::size_t> moments_;
  std::size_t next_moment_ = 0;
  std::vector<std::vector<Captured>> captured_;  // per moment: the allocations alive
  AllocatedMaxRanges ranges_;
  // The analysis pass's sums (SharedWalk): its timeline rows as they end,
  // the whole trace as one range (allocated's peak), the state at the end.
  AllocatedMaxRanges rows_;
  AllocatedMaxRanges peak_;
  CategoryBytes end_bytes_;
  std::size_t routes_before_ = 0;
  std::uint64_t allocated_before_ = 0;
  const std::uint32_t* freed_slot_ = nullptr;  // before() of a free_requested: its allocation's slot, if held
  std::vector<std::uint8_t> annotation_phases_;  // per string id: a Phase, or kPhaseUnread
};

}  // namespace cachealloc::analyzer
