// Recordings compared: `diff A B` (two runs) and `ranks FILE...` (one
// snapshot per rank or device of one job).
//
// Each recording is first reduced to a RunSummary: its peaks and counts, its
// sites keyed by their user frames, and its annotated phases. A summary is
// O(sites + phases), so comparing N files never keeps N analyses alive: each
// file's replay state is dropped once its summary is made.
//
// Matching. Sites are matched by the text of their user frames (the site and
// the frames after it that the SiteFilter keeps, SiteNamer::lines), never by
// address or StackId, so a site of A meets the same code in B: Python frames
// for PyTorch pickles, native frames for our snapshots, with torch::unwind
// and the allocators' frames left out as every report leaves them out.
// Phases are matched by annotation name and occurrence: the 3rd "forward" of
// A meets the 3rd "forward" of B.
//
// Errors: summarize() throws SnapshotError as analyze() does; rank_files()
// throws std::invalid_argument with one line naming the path: a folder with
// no snapshot, a path that does not exist. summarize_ranks() does not throw
// for a file it cannot read: that file's row carries the reason.
// Thread safety: reentrant; summarize_ranks() runs its own pool.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/categories.hpp"
#include "cachealloc/analyzer/document.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/reports.hpp"

namespace cachealloc::analyzer {

// One site's figures over the whole trace, stacks that print alike merged.
struct SiteSummary {
  std::vector<std::string> frames;  // the match key: SiteNamer::lines
  std::uint64_t allocs = 0;
  std::uint64_t alloc_bytes = 0;    // block sizes allocated over the trace
  std::uint64_t bytes_at_peak = 0;  // live at the allocated peak
  std::uint64_t live_at_end = 0;
};

// One annotation from its begin to its end (or to the end of the trace).
struct PhaseSummary {
  std::string name;
  std::uint32_t occurrence = 1;  // the n-th annotation of this name, from 1
  std::string path;              // the annotations open around it, joined with '/'
  std::size_t begin_event = 0;
  std::size_t end_event = kNoEvent;  // kNoEvent: still open at the end of the trace
  std::uint64_t allocated_at_begin = 0, reserved_at_begin = 0;
  std::uint64_t allocated_at_end = 0, reserved_at_end = 0;
  // Maxima from the begin (its state included) to the end, as PyTorch's
  // max_memory_*() read after reset_peak_memory_stats() at the begin.
  std::uint64_t peak_allocated = 0, peak_reserved = 0;
  std::uint64_t allocs = 0, alloc_bytes = 0;  // nested phases included
  // It ended before the ring's first memory event of a trace begun mid-run
  // (Analysis::ring_begins_at): no memory was recorded in it, and its
  // figures are unknown.
  bool before_ring = false;
};

struct RunSummary {
  std::string file;
  std::string program;
  std::int32_t device = 0;
  std::string device_name;
  std::optional<std::uint64_t> device_total;  // from the file; PyTorch pickles hold none
  // The allocator's cap (a memory fraction) that its OOM events recorded,
  // the smallest where several did: what the run could reserve, below the
  // device total.
  std::optional<std::uint64_t> cap;
  std::uint64_t events = 0;
  bool lower_bounds = false;  // Analysis::truncated(): peaks and counts may be larger
  // A stream that dropped events while it was written (when_full=drop): the
  // replay misses them anywhere in the run, so peaks and counts may lie on
  // either side, neither exact nor bounds (lower_bounds is then false).
  bool approximate = false;
  std::uint64_t peak_reserved = 0, peak_allocated = 0, peak_active = 0, peak_requested = 0;
  std::uint64_t reserved_at_end = 0, allocated_at_end = 0;
  std::uint64_t peak_segments = 0, segments_at_end = 0;
  std::uint64_t device_allocs = 0, device_frees = 0, ooms = 0;
  // External fragmentation at the reserved peak (read at the first request
  // after it, as the replay report reads it) and at the end. The first is
  // measured only with SummaryOptions::phases (the pass that reads it).
  std::optional<double> fragmentation_at_peak;
  double fragmentation_at_end = 0;
  // What allocated is made of at its peak and at the end (categories.hpp),
  // and where the categories came from ("inferred").
  CategoryBytes categories_at_peak, categories_at_end;
  std::string category_source;
  std::vector<SiteSummary> sites;    // bytes at the peak, largest first
  std::vector<std::string> site_notes;  // how some sites were named (SiteNamer::notes)
  std::vector<PhaseSummary> phases;  // in order of their begin
  bool has_phases_pass = false;
};

struct SummaryOptions {
  SiteFilter sites;
  std::int32_t device = -1;
  // A second replay for the phases and the fragmentation at the peak (diff);
  // ranks needs neither.
  bool phases = true;
};

// analyze() (one pass, plus the backward pass of a mid-run start), then with
// `phases` one more forward replay. Memory: one analysis, freed on return.
RunSummary summarize(EventSource& source, const SummaryOptions& options);

// diff A B.
struct DiffOptions {
  enum class SiteMetric { peak, allocated_over_run, end } by = SiteMetric::peak;  // what "grown" measures
  std::size_t limit = 20;  // sites listed; 0: all (phases are always all listed)
};
Document diff_report(const RunSummary& a, const RunSummary& b, const DiffOptions& options);

// ranks FILE... | DIR.
// The snapshots named, a folder standing for the snapshots in it (files
// whose content is a snapshot are recognised later; here: every regular
// file not ending in .json, .txt, .log, .csv, .md or .html). Sorted
// naturally by file name (rank_2 before rank_10), then by path.
std::vector<std::filesystem::path> rank_files(const std::vector<std::string>& arguments);

// "rank_12.pickle" -> 12: the number after "rank", else after "gpu",
// "device" or "cuda", else the name's only number; nullopt when none.
std::optional<std::uint32_t> rank_from_name(const std::string& file_name);

struct RanksOptions {
  SummaryOptions summary{SiteFilter{}, -1, false};
  unsigned threads = 0;  // 0: std::thread::hardware_concurrency()
  unsigned decode_threads = 0;  // FileEvents' own decoders, per file
  std::size_t site_limit = 10;  // sites listed by spread
  std::function<void(std::size_t done, std::size_t total)> progress;  // after each file, from any thread
};
struct RankSummary {
  std::optional<std::uint32_t> rank;  // from the name; none where another file's name gives the same number
  bool rank_shared = false;           // the number its name gives is another file's too
  RunSummary run;       // run.file always; the figures only where readable()
  std::string error;    // why the file could not be read ("cannot read FILE: ..."); empty when it was
  bool readable() const noexcept { return error.empty(); }
};
// One summary per file and device, in the order given (a file's devices in
// index order; only options.summary.device where it is set). A file that
// cannot be read, or lacks the device asked for, gives one row whose
// `error` says why, and the others go on. At most `threads` files are open
// at a time, so memory is about `threads` times the largest file's replay
// state plus the summaries.
std::vector<RankSummary> summarize_ranks(const std::vector<std::filesystem::path>& files, const RanksOptions& options);

// The fleet's figures, from the summaries.
struct RanksFigures {
  double median_peak_reserved = 0, median_peak_allocated = 0;
  double imbalance_reserved = 0, imbalance_allocated = 0;  // max / median; 0 when the median is 0
  std::optional<std::size_t> closest_to_oom;               // index into the ranks
  bool headroom_known = false;  // closest_to_oom by headroom (else by peak reserved)
};
RanksFigures ranks_figures(const std::vector<RankSummary>& ranks);
Document ranks_report(const std::vector<RankSummary>& ranks, const RanksOptions& options);
// One JSON object per line and rank, for DuckDB or Spark:
// {"rank", "position", "file", "error" (null; for an unreadable file the
// reason, and no other key), "device", "peak_reserved", "peak_allocated", "driver_total",
//  "headroom", "peak_reserved_vs_median", "closest_to_oom", ..., "top_sites"}.
void write_ranks_jsonl(const std::vector<RankSummary>& ranks, const RanksOptions& options, std::ostream& out);

}  // namespace cachealloc::analyzer
