// The reports of cachealloc-analyze, one builder per subcommand. Each takes
// a snapshot and options and returns a Document (document.hpp) for any of
// the three renderers. Builders never print and never exit.
//
// Exactness: when the ring overflowed (dropped_events > 0) the state before
// the ring is derived from the final layout (derive_initial_layout, or the
// ring start a version 4 file stores, which the writer derived), so
// layouts, live sets and figures at the end are exact, while counts, peaks and
// per-site totals are exact for the ring but only lower bounds for the whole
// run. Builders mark such fields lower_bound and say so in the notes.
//
// Cost: summary, fragmentation, timeline, top and oom make one pass over the
// events; peak, segments --at and leaks make at most two. A trace that does
// not start from an empty allocator adds one backward pass, unless the file
// stores its ring start (format version 4). Memory: the
// replayed state plus one block of events, and the Document itself.
//
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/document.hpp"
#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::analyzer {

// Which frames of a stack belong to the user's program. A site is the first
// such frame, innermost first; Python frames are preferred when the stack
// has any of the user's. A C++ frame prints bare: no return type,
// parameters, template arguments or "(??)". A stack with none of the user's
// frames is named by what PyTorch ran (SiteNamer::site). Left out by default:
//   - the allocators' own frames: cachealloc's, and PyTorch's (c10::, at::,
//     torch::, torch::unwind, CapturedTraceback, gather_with_cpp);
//   - the C++ standard library, libc, the Python interpreter (Py*, _Py*);
//   - Python frames of torch itself (a path with /torch/) and <frozen ...>;
//   - frames matching any `drop` pattern (ECMAScript regex, searched in
//     "function (file:line)").
// `all_frames` turns the filter off: the site is then the first frame
// outside cachealloc, and every frame is listed.
struct SiteFilter {
  bool all_frames = false;
  std::vector<std::string> drop;
  std::size_t frames = 5;  // frames listed per stack, from the site outwards; 0 = all that pass
};

// Names sites and lists their frames under a SiteFilter, classifying each
// frame once. Throws std::regex_error for a bad pattern (at construction).
// Thread safety: none; one per report.
class SiteNamer {
 public:
  SiteNamer(const snapshot::Snapshot& snapshot, const SiteFilter& filter);
  ~SiteNamer();
  SiteNamer(const SiteNamer&) = delete;
  SiteNamer& operator=(const SiteNamer&) = delete;
  // "function (file:line)" of the site's frame. A stack with no frame of
  // the user's is named by what ran it: "cuBLAS workspace (...)", the
  // autograd node and the ATen op under it ("backward: ConvolutionBackward0,
  // sum (aten)"), an op ("sum (aten)"), else its first frame past the
  // allocators'. Our recorder's frames and the allocators' are never a site:
  // a stack of ours whose native frames stop inside PyTorch (frame pointers)
  // is "inside libtorch: no frame of your program; ...", one with no frame
  // past ours "inside cachealloc: ...". A stack with no frame at all: "backward pass (no Python
  // frame)" in a recording of Python frames only (stacks='python': the
  // autograd engine's thread runs no Python), else "<unknown site>".
  std::string site(snapshot::StackId stack);
  // The site and the frames after it that pass the filter, at most filter.frames.
  std::vector<std::string> lines(snapshot::StackId stack);
  // Whether the frame belongs to the user's program (always true with all_frames).
  bool is_user_frame(snapshot::FrameId frame);
  // One stack for all stacks that print the same: the same site and the same
  // user frames after it (they differ only in frames the filter leaves out).
  // Reports add up their figures under it. The smallest such StackId.
  snapshot::StackId representative(snapshot::StackId stack);
  // One line per kind of site named so far that needs explaining (the
  // frameless backward pass, "<unknown site>", "inside libtorch"): how to
  // record what names it.
  std::vector<std::string> notes() const;

 private:
  std::string frameless_site();
  struct State;
  std::unique_ptr<State> state_;
};

struct ReportOptions {
  SiteFilter sites;
  std::int32_t device = -1;  // -1: pick_device()
  EventWindow window;
  // timeline, events / fragmentation over time: N slices of the window; for
  // timeline and events 0 means one row per event.
  std::size_t buckets = 0;
  // timeline and events with one row per event: the rows are produced while the document
  // is rendered (Document::streamed), so memory stays one row whatever the
  // trace's length. The source must then outlive the render.
  bool stream_rows = false;
  std::size_t limit = 0;    // longest listing, 0 = no limit
  std::optional<std::size_t> at;  // segments: the state just after this event
  bool peak_reserved = false;     // peak: the reserved peak instead of the allocated one
  std::uint64_t min_size = 0;     // leaks
  std::vector<snapshot::EventKind> kinds;  // events: empty = all
  enum class SiteOrder { bytes, count, peak } order = SiteOrder::bytes;  // top
  std::function<void(std::size_t, std::size_t)> progress;
  unsigned threads = 1;  // AnalysisOptions::threads
};

// Each builder reads the events through an EventSource (event_source.hpp),
// block by block; the Snapshot overloads wrap the snapshot in one.
Document summary_report(EventSource& source, const ReportOptions& options);
Document segments_report(EventSource& source, const ReportOptions& options);
Document fragmentation_report(EventSource& source, const ReportOptions& options);
Document timeline_report(EventSource& source, const ReportOptions& options);
Document peak_report(EventSource& source, const ReportOptions& options);
Document top_report(EventSource& source, const ReportOptions& options);
Document leaks_report(EventSource& source, const ReportOptions& options);
Document oom_report(EventSource& source, const ReportOptions& options);
Document events_report(EventSource& source, const ReportOptions& options);

Document summary_report(const snapshot::Snapshot& snapshot, const ReportOptions& options);
Document segments_report(const snapshot::Snapshot& snapshot, const ReportOptions& options);
Document fragmentation_report(const snapshot::Snapshot& snapshot, const ReportOptions& options);
Document timeline_report(const snapshot::Snapshot& snapshot, const ReportOptions& options);
Document peak_report(const snapshot::Snapshot& snapshot, const ReportOptions& options);
Document top_report(const snapshot::Snapshot& snapshot, const ReportOptions& options);
Document leaks_report(const snapshot::Snapshot& snapshot, const ReportOptions& options);
Document oom_report(const snapshot::Snapshot& snapshot, const ReportOptions& options);
Document events_report(const snapshot::Snapshot& snapshot, const ReportOptions& options);

// What `export --what` can write, and the table of which report it writes.
enum class ExportTable { timeline, events, segments, sites };
std::optional<ExportTable> parse_export_table(const std::string& name) noexcept;
Document export_report(const snapshot::Snapshot& snapshot, ExportTable what, const ReportOptions& options);
Document export_report(EventSource& source, ExportTable what, const ReportOptions& options);

// flamegraph (flamegraph.cpp): the bytes live at one moment, by stack.
// Stacks are the site and the frames after it that the SiteFilter keeps
// (SiteNamer::lines), written root first. Cost: analyze() to find the moment
// (peak or end), then replay_to() it: two passes at most.
enum class FlameMetric { allocated, requested, reserved };
struct FlameOptions {
  FlameMetric metric = FlameMetric::allocated;
  // The moment: the metric's peak, the window's end, or just after `event`.
  enum class At { peak, end, event } at = At::peak;
  std::size_t event = 0;
};
struct FlameStack {
  std::vector<std::string> frames;  // root (outermost) first; never empty
  std::uint64_t bytes = 0;
};
struct FlameGraph {
  std::string title;       // "<program> (pid N), device D: allocated at the peak, after event #N"
  std::string metric;      // "allocated", "requested" or "reserved"
  std::size_t event = kNoEvent;  // the moment: just after this event; kNoEvent: before the first
  std::uint64_t total = 0;       // live bytes of the metric then: the sum of `stacks`
  std::vector<FlameStack> stacks;  // one per distinct printed stack, largest first
};
// allocated: block sizes of allocated blocks; requested: requested bytes of
// active blocks (pending frees included, as Totals::requested); reserved:
// each segment's mapped bytes, under the segment's allocation stack.
FlameGraph flame_graph(EventSource& source, const ReportOptions& options, const FlameOptions& flame);
// "frame;frame;frame bytes" per stack, root first (flamegraph.pl, speedscope).
// ';' and line breaks inside a frame become ',' and ' '.
void write_collapsed(const FlameGraph& graph, std::ostream& out);
// A self-contained SVG (icicle: root on top): inline script for click to
// zoom, search (regex) and reset; no external reference. Valid XML.
void write_flame_svg(const FlameGraph& graph, std::ostream& out);

// export --what perfetto (perfetto.cpp): Chrome trace-event JSON for
// ui.perfetto.dev. Per device: counter tracks "cuda:D allocated|reserved|active"
// ("C"), instants ("i") for oom, empty_cache, segment_alloc and
// segment_release; annotation phases as complete slices ("X") on one track.
// Timestamps in microseconds since events[0]. With buckets > 0 the window is
// cut into that many slices of events and each slice writes, per counter, its
// largest value (at the time it was reached) and its last one, so peaks are
// exact; buckets == 0 writes every change. Cost: per device analyze() and one
// more replay. Memory: the replayed state and the open annotations.
inline constexpr std::size_t kDefaultPerfettoBuckets = 4000;
void write_perfetto_trace(EventSource& source, const ReportOptions& options, std::size_t buckets, std::ostream& out);

// Symbolized stacks, from the snapshot's tables.
// "function (file:line)", or the hex ip and module when unresolved.
std::string frame_text(const snapshot::Snapshot& snapshot, snapshot::FrameId frame);
// The site under the default SiteFilter; "<unknown site>" for an empty stack.
std::string top_frame(const snapshot::Snapshot& snapshot, snapshot::StackId stack);
// The site's frames under the default SiteFilter.
std::vector<std::string> stack_lines(const snapshot::Snapshot& snapshot, snapshot::StackId stack);
// Open annotations joined with '/', "" when none.
std::string phase_text(const snapshot::Snapshot& snapshot, const std::vector<snapshot::StringId>& phase);

}  // namespace cachealloc::analyzer
