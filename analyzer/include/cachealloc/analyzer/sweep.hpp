// The setting sweep and the recommendation: the recorded request
// stream replayed through the real allocator (replay_allocator) under every
// point of a grid of allocator settings, ranked, and the one verdict drawn
// from the ranking.
//
// The grid is the product of four axes, each a CACHEALLOC_CONF key with its
// values (the rest of the settings stay as recorded, plus SweepOptions::set):
//   expandable_segments            False, True
//   max_split_size_mb              unlimited, and up to three sizes taken from
//                                  the trace's large requests (the quartile,
//                                  median and 90th percentile of requests
//                                  over 20 MiB, in MiB, rounded up)
//   roundup_power2_divisions       0, 4, 8
//   garbage_collection_threshold   off, and 0.8 under a cap (it acts only
//                                  under one)
// sweep_axis() parses "KEY=V1,V2,..." to replace one axis's values.
//
// Ranking. Without a cap: by peak reserved, lowest first. With one: the
// points that fit (no OOM) first, by peak reserved (the most headroom
// first), then those that run out of memory, the latest OOM first. Ties go
// to the point that changes fewer recorded settings, then to grid order, so
// the ranking (and the recommendation) is the same for every thread count.
//
// Threads. Every replay has its own allocator and simulated device. The
// events are decoded once into memory (an EventSource belongs to one thread;
// reading a FileEvents from several would race) and each worker replays
// them through its own SnapshotEvents view of that one read-only copy.
// Memory: the events (56 B each) plus one replay's state per thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cachealloc/analyzer/allocator_replay.hpp"
#include "cachealloc/analyzer/document.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/reports.hpp"

namespace cachealloc::analyzer {

struct SweepAxis {
  std::string key;                  // a CACHEALLOC_CONF key
  std::vector<std::string> values;  // as written: "True", "unlimited", "0", "off", "0.8"
};

// The keys a sweep can vary, in grid order.
const std::vector<std::string>& sweep_keys();

// Parses "KEY=V1,V2,..." (or "KEY:V1,..."), checking each value as the
// allocator would. Throws InvalidArgument with a one-line what() for an
// unknown key, an empty list, a repeated value or a value out of range.
SweepAxis sweep_axis(const std::string& text);

struct SweepOptions {
  std::int32_t device = -1;
  // Pairs over the recorded settings for every point; a key that is also
  // swept is refused (InvalidArgument).
  std::vector<std::string> set;
  std::optional<double> fraction;           // the cap, as in AllocatorReplayOptions
  std::optional<std::uint64_t> capacity;
  std::optional<double> recorded_fraction;
  Placement placement = Placement::recorded;
  // Replace the default values of these axes (each key at most once).
  std::vector<SweepAxis> axes;
  unsigned threads = 0;  // 0: std::thread::hardware_concurrency()
  // Under a cap: also find, for each point, the largest factor by which
  // every request can grow and still fit (AllocatorReplayOptions::scale),
  // to 1/64 by bisection (about 8-12 more replays a point), and rank by it
  // first. A stand-in for "the largest batch that fits": exact only when
  // every tensor scales with the batch (weights do not, so the real batch
  // may be larger).
  bool largest_scale = false;
};

struct SweepPoint {
  std::size_t index = 0;  // in grid order
  std::vector<std::pair<std::string, std::string>> settings;  // one per axis, grid order
  // The settings that differ from the recorded ones, "key:value,...";
  // empty: this point is the recorded settings.
  std::string changes;
  std::size_t changed = 0;
  std::string config;  // canonical text of the settings replayed
  RunFigures figures;  // the replayed run's
  // It did not run out of memory and its peak reserved stayed within the
  // cap. Under expandable segments PyTorch checks the cap against the
  // request's segment size, not what the segment maps, so a run can pass the
  // cap without an OOM (the allocator mirrors this); it does not fit.
  bool fits = true;
  std::optional<std::int64_t> headroom;  // cap - peak reserved (negative: over it); nullopt without a cap
  std::optional<double> largest_scale;   // SweepOptions::largest_scale: 0 when not even 1/64 fits
};

// Where the sweep's cap came from.
enum class CapSource {
  none,           // no cap: the run is ranked by peak reserved
  asked,          // --capacity or --fraction
  recorded,       // the cap the recorded OOM names (our files)
  oom_bound,      // the recorded OOM bounds a cap the file does not hold: its lowest value
  device_at_oom,  // the recorded OOM found the device full: reserved + the device's free bytes then
};

// What the recorded run's first OOM says of the memory it had, where the
// file holds no cap (PyTorch's pickles): the allocator stopped at a cap
// within [lowest, highest) when the device still had room for the request
// (lowest: the peak reserved up to the OOM; highest: reserved at the OOM +
// the request), else the device itself was full at lowest.
struct OomCapBounds {
  std::size_t event = 0;
  std::uint64_t reserved = 0;   // reserved at the OOM
  std::uint64_t allocated = 0;  // live bytes at the OOM
  std::uint64_t requested = 0;
  std::uint64_t lowest = 0, highest = 0;
  bool device_full = false;
};

struct SweepResult {
  std::uint64_t events = 0;
  std::uint64_t cap = 0;  // the replays' cap in bytes, 0: none
  CapSource cap_source = CapSource::none;
  std::optional<OomCapBounds> oom_bounds;  // a recorded OOM with no cap in the file
  std::uint64_t device_total = 0;
  std::string recorded_config;
  // The recorded settings under the same cap: its recorded column is the
  // recorded run, its replayed column the baseline every point is compared with.
  ReplayResult baseline;
  std::vector<SweepAxis> axes;     // the grid that ran
  std::vector<SweepPoint> ranked;  // best first
  unsigned threads = 1;
};

// The default grid for `source` (see above); `capped` adds the
// garbage_collection_threshold value.
std::vector<SweepAxis> default_sweep_axes(EventSource& source, std::int32_t device, bool capped);

// Runs the grid. Throws as replay_allocator() (SnapshotError, ConfigError,
// InvalidArgument), before any replay where it can. Cost: one decode of the
// events, then (grid points + 1) replays spread over `threads` threads.
SweepResult sweep(EventSource& source, const SweepOptions& options);

// The ranking as a report: table "sweep" (one row per point, best first) and
// the baseline.
Document sweep_report(const SweepResult& result);

// The verdict drawn from a sweep.
struct Recommendation {
  bool helps = false;               // a point beats the recorded settings
  std::optional<SweepPoint> best;   // the top point that differs from the recorded settings
  std::string verdict;              // one sentence, with the evidence
};
Recommendation recommend(const SweepResult& result);

struct RecommendOptions {
  SweepOptions sweep;
};
// recommend(sweep(...)) as a report: the verdict, the evidence (the recorded
// run, the baseline at the cap and the best point) and the top of the ranking.
// Without a capacity or fraction, the recorded cap (from the recorded OOM)
// applies, else none.
Document recommend_report(EventSource& source, const RecommendOptions& options);

// The oom report, plus, when the trace has an out-of-memory event, a
// "recommendation" section from a small grid (expandable segments x
// max_split_size_mb unlimited or the median large request x
// roundup_power2_divisions 0 or 4 x garbage collection off or 0.8: 16
// replays) at the recorded cap, or the device total when the OOM recorded
// none. Traces of more than `max_events` events get a note pointing at
// `recommend` instead. Never throws for a trace the replay cannot handle:
// the section then says why.
Document oom_report_with_recommendation(EventSource& source, const ReportOptions& options, unsigned threads = 0,
                                        std::uint64_t max_events = 20'000'000);

}  // namespace cachealloc::analyzer
