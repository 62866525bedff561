// What-if replay: the recorded request stream of a snapshot, run through the
// real caching allocator (cachealloc::recorder) on the simulated device,
// under the recorded settings or others, with the recorded run's figures
// beside the replayed run's.
//
// The request stream is what the program asked of the allocator, read back
// from the events: every alloc (its requested bytes and stream), every free,
// the frees that waited for other streams (record_stream: a free_requested
// whose free_completed comes later; the replay marks the block used on a
// stream of its own and completes that stream where the recording completed
// the free), every empty_cache, and every failed request (an oom event). The
// allocator's own reactions (segments, splits, merges, the releases of an
// OOM retry or of garbage collection) are not replayed: the allocator makes
// them itself. PyTorch's traces have no empty_cache entry: a run of segment
// releases counts as the program's empty_cache unless it is the allocator's
// own (followed by a reservation or an OOM while the recorded reserved bytes
// plus the new segment exceed the recorded cap, or while garbage collection
// is due), see ReplayResult::inferred_empty_cache.
//
// A trace that begins mid-run (a ring that overflowed, or history switched on
// late) starts from its layout at the ring's start: the replay builds every
// segment of that layout, block by block, before the first event.
//
// Placement. PyTorch's best fit breaks ties between equal-sized free blocks
// by address, so where segments sit decides which one is reused. By default
// (Placement::recorded) each reservation lands where the recording put it,
// for as long as the replay reserves the same sizes in the same order; from
// the first reservation that differs on, the simulated device's driver
// address model places them (as a fresh process on the H200 would).
// Placement::model uses the model throughout.
//
// Never touches a GPU: only the simulated device. Thread safety: reentrant;
// one call per source.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/config.hpp"
#include "cachealloc/stats.hpp"
#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::analyzer {

// Where one request failed.
struct OomPoint {
  std::uint64_t event = 0;      // index into the recorded events
  std::uint64_t requested = 0;  // bytes asked for
  std::string annotation;       // the open annotations, outermost first, joined by '/'; empty when none
  // A trace begun mid-run whose layout at its start already reserves more
  // than the cap: the run could not have reached its first event under it.
  // `event` is then 0 and `requested` the bytes reserved at the start.
  bool at_start = false;
};

// One run's figures. Unknown figures are nullopt (never 0).
struct RunFigures {
  std::uint64_t peak_reserved = 0;
  std::uint64_t peak_allocated = 0;
  // The recorded event after which the peak held, as summary names it (the
  // reservation, not the request that made it); kNoEvent: at the trace's start.
  // The replayed run names the recorded reservation of the request it reached
  // its peak serving, the same event for the same moment; the request itself
  // where the recording reserved nothing for it.
  std::uint64_t peak_reserved_event = 0;
  std::uint64_t segments = 0;             // cudaMalloc segments at the end (segment.all.current)
  std::uint64_t device_allocs = 0;        // reservations (num_device_alloc), the ring start's included
  std::uint64_t device_frees = 0;         // releases (num_device_free)
  std::optional<std::uint64_t> retries;   // num_alloc_retries; a trace does not show them
  std::uint64_t ooms = 0;
  std::uint64_t reserved_at_end = 0;
  std::uint64_t allocated_at_end = 0;
  // At the peak of reserved bytes: cached free bytes, the largest free block,
  // and 1 - largest_free / cached_free (0 when nothing is free).
  std::uint64_t cached_free_at_peak = 0;
  std::uint64_t largest_free_at_peak = 0;
  double fragmentation_at_peak = 0;
  std::optional<OomPoint> first_oom;
};

enum class Placement { recorded, model };

// What the hook may do between events.
class ReplayControl {
 public:
  virtual ~ReplayControl() = default;
  virtual MemoryStats stats() const = 0;  // the replaying allocator's, now
  virtual void reset_peak_stats() = 0;    // as torch.cuda.reset_peak_memory_stats()
};

struct AllocatorReplayOptions {
  std::int32_t device = -1;  // pick_device()
  // CACHEALLOC_CONF pairs over the recorded settings, "key=value" or
  // "key:value", applied in order (the last of a key wins).
  std::vector<std::string> set;
  // The settings to replay under, whole: when present, replaces the recorded
  // settings and `set` (the sweep builds each grid point's this way, since
  // some values, e.g. max_split_size unlimited, have no key:value text).
  std::optional<AllocatorConfig> config;
  // The replay's memory cap: a fraction of the device total, or bytes (one of
  // the two). Neither: no cap.
  std::optional<double> fraction;
  std::optional<std::uint64_t> capacity;
  // The recorded run's cap, which a PyTorch pickle does not store: used only
  // to tell the program's empty_cache from the allocator's own releases. When
  // absent: an oom event's cap, else the replay's fraction.
  std::optional<double> recorded_fraction;
  Placement placement = Placement::recorded;
  // Every request's bytes times this (rounded, at least 1): the same program
  // with every tensor `scale` times as large, e.g. a batch that much larger
  // when every tensor scales with it. The ring-start layout is not scaled.
  double scale = 1.0;
  // Called after each annotation event (name from the string table), with
  // the replaying allocator, e.g. to reset its peaks where the recorded
  // program did. Optional.
  std::function<void(const snapshot::Event&, std::string_view name, ReplayControl&)> on_annotation;
};

struct ReplayResult {
  std::int32_t device = 0;
  std::uint64_t events = 0;
  std::string recorded_config;  // canonical CACHEALLOC_CONF text of the recorded settings
  std::string replayed_config;
  bool settings_known = true;   // false: the file has no settings, defaults assumed
  std::uint64_t device_total = 0;  // the simulated device's
  bool device_total_known = false;  // the file gave it (else an H200's, or --capacity when larger)
  std::uint64_t cap = 0;        // the replay's cap in bytes, 0 = none
  std::uint64_t recorded_cap = 0;
  bool starts_mid_run = false;
  std::uint64_t initial_segments = 0;
  std::uint64_t initial_blocks_not_rebuilt = 0;  // ring-start segments the allocator did not lay out as recorded
  std::uint64_t joined_fragments = 0;            // see the note the replay adds when not 0
  std::uint64_t inferred_empty_cache = 0;        // PyTorch traces: release runs taken for empty_cache
  std::uint64_t deferred_frees = 0;              // frees that waited for another stream
  // The queues they waited in: frees that complete in the order requested
  // share one; the replay's cost per request grows with this, not with
  // deferred_frees.
  std::uint64_t deferred_queues = 0;
  // Private memory pools (CUDA graph captures, MemPools) inferred from the
  // recorded addresses, and the requests replayed in them (see
  // docs/VERIFICATION.md, "Private pools inferred from the recorded
  // addresses").
  std::uint64_t inferred_private_pools = 0;
  std::uint64_t private_pool_requests = 0;
  std::uint64_t requests = 0;                    // allocs and failed requests replayed
  // Reservations placed where the recording put them before the replay's
  // first differed (Placement::recorded), and whether one differed.
  std::uint64_t placed_as_recorded = 0;
  bool placement_diverged = false;
  RunFigures recorded;
  RunFigures replayed;
  // The replay reached its peak reserved serving a request for which the
  // recording reserved nothing: replayed.peak_reserved_event names that
  // request, not a recorded reservation (see RunFigures::peak_reserved_event).
  bool replayed_peak_at_request = false;
  std::vector<std::string> notes;
};

// The settings the recording ran under: ours keep the CACHEALLOC_CONF text,
// PyTorch's pickles each value of allocator_settings. `known` is false when
// the file holds none (PyTorch's defaults are returned). Throws ConfigError
// for a recorded text that does not parse.
AllocatorConfig recorded_settings(const snapshot::Snapshot& head, bool& known);

// `base` (CACHEALLOC_CONF text) with each --set pair over it, KEY=VALUE or
// KEY:VALUE. Each pair is checked alone first, so a bad one is named as the
// user wrote it: ConfigError "--set KEY=VALUE: why".
std::string settings_with(std::string base, const std::vector<std::string>& set);

// Replays `source`. Throws snapshot::SnapshotError for an unreadable block,
// ConfigError for a bad --set pair, InvalidArgument for a bad fraction or
// capacity or a trace it cannot replay (a ring start with expandable
// segments), each with a one-line what().
// Cost: two forward passes over the events (the recorded figures, then the
// replay) plus, for a trace that begins mid-run, one backward pass; memory
// O(live blocks + segments).
ReplayResult replay_allocator(EventSource& source, const AllocatorReplayOptions& options = {});

}  // namespace cachealloc::analyzer

#include "cachealloc/analyzer/document.hpp"

namespace cachealloc::analyzer {

// The replay report: the recorded and the replayed run side by side (tables
// "memory" and "counts"), the settings of each, where each first ran out of
// memory, and notes on what the replay inferred. Throws as replay_allocator().
Document replay_report(EventSource& source, const AllocatorReplayOptions& options);
Document replay_report(const ReplayResult& result);

}  // namespace cachealloc::analyzer
