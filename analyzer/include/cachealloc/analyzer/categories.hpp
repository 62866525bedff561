// What memory is made of: each allocation's category (parameter, gradient,
// optimizer state, activation, temporary, workspace, CUDA graph pool,
// other), and the bytes of each category at any moment.
//
// A category comes with its source. `inferred` is a guess from the trace:
// the allocation's frames, the annotations open around it (Optimizer.step,
// record_function names) and its lifetime (which phase of a training step
// made it and which one freed it); docs/GLOSSARY.md gives every rule. An
// allocation whose frames, phase and lifetime say nothing is `other`, never
// a guess. `exact` is a category the program recorded itself (a category
// event, events.hpp: the torch extension takes it from torch's own state):
// the allocation tagged while live has it for its whole life, from its
// alloc on (the last tag before its free wins); a tag at an address where
// no allocation is live is ignored and counted (ignored_tags()).
// Allocations never tagged keep the inferred rules.
//
// Exactness of the sums: the bytes of each allocation are the change it made
// to the replayed allocated total (Replay), so at every moment the
// categories add up to allocated exactly, blocks alive before the ring
// included (categorized from their stacks alone).
//
// Cost: one forward replay of the device's events, plus finding the start
// state (confirmed_start); then per query one walk of the changes kept (a
// short trace) or one more replay (a long one). Memory: see Categorization.
//
// Thread safety: plain values after categorize(); categorize() is reentrant.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/replay.hpp"
#include "cachealloc/events.hpp"

namespace cachealloc::analyzer {

// The recorder's vocabulary (events.hpp), so that a category event's code
// is a Category.
using Category = events::AllocationCategory;
inline constexpr std::size_t kCategoryCount = events::kAllocationCategoryCount;

// The JSON key and CSV column: "parameter", ..., "optimizer_state", "cuda_graph_pool", "other".
const char* category_key(Category category) noexcept;
// The words a table prints: "optimizer state", "CUDA graph pool".
const char* category_label(Category category) noexcept;
// A key, a label, or either with '-' for '_' ("optimizer-state"); nullopt for none.
std::optional<Category> parse_category(std::string_view name) noexcept;

enum class CategorySource : std::uint8_t { exact, inferred };
const char* to_string(CategorySource source) noexcept;

struct AllocationCategory {
  Category category = Category::other;
  CategorySource source = CategorySource::inferred;
};

// Bytes per category at one moment: the blocks' (they add up to allocated)
// and the bytes their allocations requested (before the 512 B rounding and
// the rest of the block; the size a program asked for, e.g. a parameter's
// numel() * element_size()).
struct CategoryBytes {
  std::array<std::uint64_t, kCategoryCount> bytes{};
  std::array<std::uint64_t, kCategoryCount> requested{};
  std::uint64_t& operator[](Category c) noexcept { return bytes[static_cast<std::size_t>(c)]; }
  std::uint64_t operator[](Category c) const noexcept { return bytes[static_cast<std::size_t>(c)]; }
  std::uint64_t total() const noexcept {
    std::uint64_t sum = 0;
    for (const std::uint64_t b : bytes) sum += b;
    return sum;
  }
};

// One allocation as the categorizer saw it.
struct CategorizedAllocation {
  std::size_t alloc_event = kNoEvent;  // kNoEvent: alive before the ring's first event
  std::size_t free_event = kNoEvent;   // the free_requested; kNoEvent: alive at the end
  std::uint64_t bytes = 0;             // its change to allocated (the block size)
  snapshot::StackId stack{};
  AllocationCategory category;
  std::uint64_t requested = 0;  // the alloc's requested bytes (the block size where the trace has none)
};

// One change of allocated: an allocation came (made) or went (freed).
struct CategoryChange {
  std::size_t event = kNoEvent;  // kNoEvent: part of the state before the first event
  std::size_t allocation = 0;    // its number: those alive before the first event first, then in event order
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  snapshot::StackId stack{};     // the alloc's (a free's change repeats it where known)
  AllocationCategory category;
  bool freed = false;
  std::uint64_t requested = 0;  // the allocation's requested bytes
};

struct CategorizeOptions {
  // Up to this many changes are kept in memory (48 bytes each), so that a
  // query walks them instead of replaying the trace again; a longer trace
  // is replayed from its source for each query, in memory bounded by its
  // layout. 0: always replay.
  std::size_t max_kept_changes = std::size_t{1} << 20;
  // Moments whose bytes per category the walk itself sums (in increasing
  // order, kNoEvent first: before the first event), so that at() of them
  // needs no further walk: a report that asks for the peak and the end
  // reads a long trace once less.
  std::vector<std::size_t> moments;
  // Ranges [first, last] of events whose bytes per category at their
  // allocated maximum the walk itself sums, as at_allocated_max() gives them
  // (timeline's rows), so that at_allocated_max() of the same ranges needs
  // no further walk. Allocations are settled only when freed, so a range's
  // figures are gathered as its allocations are freed: O(log ranges) a
  // free, O(ranges) memory.
  std::vector<std::pair<std::size_t, std::size_t>> allocated_max_ranges;
  // The start the events confirmed, where the caller has it already
  // (Analysis::start, of the same device): saves confirmed_start()'s replay
  // of every event. Null: categorize() finds it.
  std::shared_ptr<const InitialLayout> start;
};

// Memory: half a byte per allocation (its category), plus the kept changes
// of a short trace; the walks hold the replayed layout. A Categorization
// reads its EventSource again for each query of a long trace: the source
// must outlive it.
class Categorization {
 public:
  std::int32_t device = 0;

  std::size_t allocation_count() const noexcept { return count_; }
  AllocationCategory category_of(std::size_t allocation) const noexcept;
  // Whether any category came from a guess (every one, in a trace without
  // category events): reports then mark their category figures "inferred".
  bool any_inferred() const noexcept { return count_ == 0 || exact_ < count_; }
  bool any_exact() const noexcept { return exact_ != 0; }
  // Allocations of a category, and how many of them are exact.
  std::size_t count_in(Category category) const noexcept { return count_by_category_[static_cast<std::size_t>(category)]; }
  std::size_t exact_in(Category category) const noexcept { return exact_by_category_[static_cast<std::size_t>(category)]; }
  // Category events at an address where no allocation of the device was
  // live (or with a code past the last category): ignored.
  std::size_t ignored_tags() const noexcept { return ignored_tags_; }
  // Whether a category's figures are a guess: some allocation of it, or
  // none at all, has an inferred category.
  bool inferred(Category category) const noexcept {
    const auto c = static_cast<std::size_t>(category);
    return exact_by_category_[c] < count_by_category_[c] || count_by_category_[c] == 0;
  }
  // Whether the changes are in memory (a short trace) or replayed per query.
  bool changes_kept() const noexcept { return kept_; }

  // Bytes per category just after each of `events` (kNoEvent: before the
  // first event), which must be in increasing order, kNoEvent first. One
  // walk of the changes.
  std::vector<CategoryBytes> at(const std::vector<std::size_t>& events) const;
  CategoryBytes at(std::size_t event) const { return at(std::vector<std::size_t>{event}).front(); }
  // Bytes per category where allocated reached its largest value inside each
  // range [first, last] of events (its first such moment; kNoEvent as
  // `last`: the state before the first event). Ranges in increasing order,
  // disjoint. The sum of each equals the range's largest allocated.
  std::vector<CategoryBytes> at_allocated_max(const std::vector<std::pair<std::size_t, std::size_t>>& ranges) const;
  // Each category's largest value over the trace, each at its own moment.
  CategoryBytes peaks() const;
  // Every allocation with its events: memory per allocation, for tests and
  // short traces.
  std::vector<CategorizedAllocation> allocations() const;

  // The bytes per category event by event, for a walk that reads the
  // events itself (a timeline of one row per event, the HTML page): give it
  // every event of the trace, from the first, in order, each once.
  class Follower {
   public:
    explicit Follower(const Categorization& categorization);
    ~Follower();
    Follower(Follower&&) noexcept;
    Follower& operator=(Follower&&) = delete;
    // The changes of the state before the first event, applied already:
    // blocks alive there, and allocations the trace frees without having
    // made them (a damaged trace), whose bytes allocated counted from the start.
    const std::vector<CategoryChange>& start() const noexcept { return start_; }
    void on_event(std::size_t index, const snapshot::Event& event);
    // The change the last event given made; nullptr where it made none.
    const CategoryChange* change() const noexcept { return changed_ ? &change_ : nullptr; }
    const CategoryBytes& now() const noexcept { return now_; }
    std::uint64_t total() const noexcept { return total_; }

   private:
    struct Replayed;
    void apply(const CategoryChange& change);
    const Categorization& c_;
    std::vector<CategoryChange> start_;
    CategoryChange change_;
    bool changed_ = false;
    std::size_t next_kept_ = 0;
    CategoryBytes now_;
    std::uint64_t total_ = 0;
    std::unique_ptr<Replayed> replayed_;
  };

 private:
  friend Categorization categorize(EventSource& source, std::int32_t device, const CategorizeOptions& options);
  friend class CategoryWalk;
  // One change as kept: the category is looked up when walked.
  struct Kept {
    std::size_t event;
    std::size_t allocation;
    std::uint64_t address;
    std::uint64_t bytes;
    std::uint32_t stack;
    bool freed;
    std::uint64_t requested;
  };
  // An allocation the trace frees without having made it: in the start state.
  struct Unmade {
    std::size_t allocation;
    std::uint64_t address;
    std::uint64_t bytes;
    std::size_t freed_at;  // the event that freed it
  };
  // A moment of CategorizeOptions::moments, with its bytes per category.
  struct Moment {
    std::size_t event;
    CategoryBytes bytes;
  };
  void set_category(std::size_t allocation, AllocationCategory category);
  // Walks every event of the source through a Follower.
  template <class Visit>
  void follow(Visit&& visit) const;

  EventSource* source_ = nullptr;
  std::shared_ptr<const InitialLayout> start_;
  bool sizes_inferred_ = false;
  std::size_t count_ = 0;
  std::size_t exact_ = 0;
  std::size_t ignored_tags_ = 0;
  std::array<std::size_t, kCategoryCount> count_by_category_{};
  std::array<std::size_t, kCategoryCount> exact_by_category_{};
  std::vector<std::uint8_t> packed_;  // two categories a byte: bits 0-2 the category, bit 3 exact
  std::vector<Unmade> unmade_;
  std::vector<Moment> moments_;
  // CategorizeOptions::allocated_max_ranges and their figures, where the
  // walk could sum them (not in a trace that frees what it never made).
  std::vector<std::pair<std::size_t, std::size_t>> summed_ranges_;
  std::vector<CategoryBytes> range_bytes_;
  bool kept_ = true;
  std::vector<Kept> kept_changes_;  // in event order, those before the first event first
};

// Categorizes every allocation of `device` (-1: pick_device) over the
// whole trace. Throws what analyze() throws for a damaged file.
Categorization categorize(EventSource& source, std::int32_t device, const CategorizeOptions& options = {});

}  // namespace cachealloc::analyzer
