// What memory is made of: each allocation's category (parameter, gradient,
// optimizer state, activation, temporary, workspace, CUDA graph pool,
// other), and the bytes of each category at any moment.
//
// A category comes with its source. `inferred` is a guess from the trace:
// the allocation's frames, the annotations open around it (Optimizer.step,
// record_function names) and its lifetime (which phase of a training step
// made it and which one freed it); docs/GLOSSARY.md gives every rule. An
// allocation whose frames, phase and lifetime say nothing is `other`, never
// a guess. `exact` is reserved for a category the recorder took from torch's
// own state; no reader fills it yet.
//
// Exactness of the sums: the bytes of each allocation are the change it made
// to the replayed allocated total (Replay), so at every moment the
// categories add up to allocated exactly, blocks alive before the ring
// included (categorized from their stacks alone).
//
// Cost: one forward replay of the device's events, plus finding the start
// state (confirmed_start), plus one ordered walk of what the replay recorded
// per query. Memory: 24 bytes per alloc and free, one record per allocation.
//
// Thread safety: plain values after categorize(); categorize() is reentrant.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/event_source.hpp"

namespace cachealloc::analyzer {

enum class Category : std::uint8_t {
  parameter,
  gradient,
  optimizer_state,
  activation,  // saved for backward
  temporary,
  workspace,  // cuBLAS, cuDNN, NCCL
  cuda_graph_pool,
  other,
};
inline constexpr std::size_t kCategoryCount = 8;

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

// Bytes per category at one moment.
struct CategoryBytes {
  std::array<std::uint64_t, kCategoryCount> bytes{};
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
};

class Categorization {
 public:
  std::int32_t device = 0;
  std::vector<CategorizedAllocation> allocations;
  // Whether any category came from a guess (every one does today): reports
  // then mark their category figures "inferred".
  bool any_inferred() const noexcept;

  // Bytes per category just after each of `events` (kNoEvent: before the
  // first event), which must be in increasing order, kNoEvent first. One
  // walk of the recorded changes.
  std::vector<CategoryBytes> at(const std::vector<std::size_t>& events) const;
  CategoryBytes at(std::size_t event) const { return at(std::vector<std::size_t>{event}).front(); }
  // Bytes per category where allocated reached its largest value inside each
  // range [first, last] of events (its first such moment; kNoEvent as
  // `last`: the state before the first event). Ranges in increasing order,
  // disjoint. The sum of each equals the range's largest allocated.
  std::vector<CategoryBytes> at_allocated_max(const std::vector<std::pair<std::size_t, std::size_t>>& ranges) const;

  // The bytes per category event by event, for a walk that cannot hold
  // every moment at once (a timeline of one row per event).
  class Cursor {
   public:
    explicit Cursor(const Categorization& categorization) : c_(categorization) {}
    // Applies every change of events up to `event` (kNoEvent: the state
    // before the first event); events in increasing order, kNoEvent first.
    const CategoryBytes& through(std::size_t event);
    // Applies the next change if its event is at most `last`; false when none is.
    bool step(std::size_t last);
    const CategoryBytes& now() const noexcept { return now_; }
    std::uint64_t total() const noexcept { return total_; }

   private:
    void apply();
    const Categorization& c_;
    std::size_t next_ = 0;
    CategoryBytes now_;
    std::uint64_t total_ = 0;
  };

  // Each category's largest value over the trace, each at its own moment.
  CategoryBytes peaks() const;

  // One change of allocated, in event order (categorize() fills it).
  struct Change {
    std::size_t event = kNoEvent;  // kNoEvent: the state before the first event
    std::uint32_t allocation = 0;  // index into `allocations`
    bool freed = false;            // the allocation's bytes leave allocated
  };
  std::vector<Change> changes;
};

// Categorizes every allocation of `device` (-1: pick_device) over the
// whole trace. Throws what analyze() throws for a damaged file.
Categorization categorize(EventSource& source, std::int32_t device);

}  // namespace cachealloc::analyzer
