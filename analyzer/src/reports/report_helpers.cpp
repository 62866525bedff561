#include "reports/report_helpers.hpp"

#include <set>

#include "cachealloc/snapshot/pickle.hpp"
#include "cachealloc/snapshot/stream.hpp"

namespace cachealloc::analyzer {

using snapshot::Snapshot;

namespace detail {

AnalysisOptions analysis_options(const ReportOptions& options) {
  AnalysisOptions result;
  result.device = options.device;
  result.window = options.window;
  result.progress = options.progress;
  result.threads = options.threads;
  return result;
}

std::string title(const Snapshot& snapshot, std::int32_t device, const std::string& what) {
  std::string line = what + ": ";
  line += snapshot.header.program.empty() ? std::string("unknown program") : snapshot.header.program;
  if (snapshot.header.pid != 0) line += " (pid " + std::to_string(snapshot.header.pid) + ")";
  line += ", device " + std::to_string(device);
  for (const snapshot::DeviceInfo& info : snapshot.devices) {
    if (info.index == device && !info.name.empty()) line += " (" + info.name + ")";
  }
  return line;
}

std::string moment(const Snapshot& snapshot, const Analysis& analysis) {
  if (analysis.window.end == 0) return "before the first event";
  const bool last = analysis.window.end == analysis.event_count;
  // A stream that lost its trailer ends at its last complete chunk, not at a dump.
  const bool cut = snapshot.settings.count(snapshot::kStreamNoteSetting) != 0;
  return "after event #" + std::to_string(analysis.window.end - 1) +
         (last ? (cut ? " (the last one read)" : " (the dump)") : "");
}

bool records_kind(const Snapshot& snapshot, snapshot::EventKind kind) {
  using snapshot::EventKind;
  if (snapshot.header.source == snapshot::kPytorchPickleSource)
    return kind != EventKind::split && kind != EventKind::merge && kind != EventKind::empty_cache;
  return kind != EventKind::snapshot;
}

bool counts_dropped_events(const Snapshot& snapshot) { return snapshot.header.source != snapshot::kPytorchPickleSource; }

bool dropped_mid_stream(const Snapshot& snapshot) {
  return snapshot.header.format_version == snapshot::kStreamFormatVersion && snapshot.dropped_events > 0;
}

void add_common_notes(Document& document, const Snapshot& snapshot, const Analysis& analysis) {
  // Events dropped anywhere in a stream: its marked figures are neither
  // exact nor bounds.
  document.approximate = dropped_mid_stream(snapshot);
  // A report shows one device; the others of the file are named, with the
  // option that shows them, so none is left out unseen.
  std::set<std::int32_t> others;
  for (const snapshot::DeviceInfo& info : snapshot.devices) others.insert(info.index);
  for (const snapshot::Segment& segment : snapshot.segments) others.insert(segment.device);
  others.erase(analysis.device);
  if (!others.empty()) {
    std::string list;
    for (const std::int32_t d : others) list += (list.empty() ? "" : ", ") + std::to_string(d);
    document.notes.push_back("this shows device " + std::to_string(analysis.device) + "; the file also holds device" +
                             (others.size() > 1 ? "s " : " ") + list + ": select one with --device " +
                             std::to_string(*others.begin()) + " (ranks lists every device)");
  }
  if (snapshot.settings.contains(snapshot::kSegmentsOnlySetting)) {
    // pickle.dump(torch.cuda.memory_snapshot()): what _memory_viz stats reads.
    document.notes.push_back("a segments-only PyTorch snapshot (torch.cuda.memory_snapshot(), not _snapshot()): "
                             "the layout at the dump is exact, but it has no trace, so there are no events, peaks, "
                             "timeline, OOMs or per-site history, and no allocator settings. Record with "
                             "torch.cuda.memory._record_memory_history() and _dump_snapshot() for those.");
  } else if (analysis.block_policy_assumed && analysis.dropped_events == 0 && !analysis.starts_mid_run) {
    document.notes.push_back("the snapshot has no allocator_settings (PyTorch before 2.11?): block sizes follow "
                             "PyTorch's default policy, so allocated figures and peaks are lower bounds (marked >=).");
  } else if (analysis.inferred_block_sizes != 0 && analysis.dropped_events == 0 && !analysis.starts_mid_run) {
    document.notes.push_back(std::to_string(analysis.inferred_block_sizes) +
                             " allocations did not follow PyTorch's policy replayed over the trace (no block fit, or "
                             "the final layout says otherwise), so their sizes are inferred: allocated figures and "
                             "peaks are lower bounds (marked >=).");
  } else if (dropped_mid_stream(snapshot)) {
    document.notes.push_back(std::to_string(snapshot.dropped_events) +
                             " events were dropped while the stream was written (the disk could not keep up and "
                             "when_full was drop): the replay misses them anywhere in the run, so peaks, counts and "
                             "per-site totals are approximate, neither exact nor bounds; check holds budgets to the "
                             "allocator's own figures. Record with when_full:wait (the default) to keep every event.");
  } else if (analysis.truncated()) {
    const std::string why = analysis.dropped_events > 0
                                ? "the ring overflowed: " + std::to_string(analysis.dropped_events) +
                                      " earlier events were lost"
                                : "the trace begins mid-run: the allocator held memory before its first memory event";
    document.notes.push_back(why +
                             ". The state before the ring was derived from the final layout; layouts and figures at "
                             "the end are exact, counts, peaks and per-site totals are lower bounds (marked >=).");
  }
  if (analysis.blocks_from_before_ring != 0) {
    document.notes.push_back(std::to_string(analysis.blocks_from_before_ring) +
                             (analysis.blocks_from_before_ring == 1 ? " block was" : " blocks were") +
                             std::string(" allocated before the ring began; their sites come from their free events."));
  }
  if (analysis.anomalies.total() != 0 || analysis.unplaced_blocks != 0) {
    document.notes.push_back(std::to_string(analysis.anomalies.total() + analysis.unplaced_blocks) +
                             " events did not fit the replayed state and were ignored; figures may be off.");
  }
  if (analysis.layout_check.checked && analysis.layout_check.differences != 0) {
    std::string note = "the replayed final layout differs from the stored one in " +
                       std::to_string(analysis.layout_check.differences) + " places";
    if (!analysis.layout_check.first_differences.empty()) note += ", e.g. " + analysis.layout_check.first_differences[0];
    document.notes.push_back(note);
  }
  if (analysis.ring_begins_at != 0) {
    const std::size_t r = analysis.ring_begins_at;
    document.notes.push_back(
        "memory is recorded from event #" + std::to_string(r) + " (" +
        format_time(analysis.ring_begins_time_ns - analysis.time_origin_ns) + "), the ring's first memory event: the " +
        std::to_string(r) + (r == 1 ? " event" : " events") + " before it are annotations older than the trace " +
        "(PyTorch keeps annotations in a ring of their own)" +
        (others.empty() ? std::string() : std::string(" or other devices' events")) +
        ", from a time whose memory of this device was not recorded" +
        (analysis.window_cut_to_ring ? std::string(", so the figures start at #") + std::to_string(r) : std::string()) +
        ".");
  }
  const std::size_t unasked_begin = analysis.window_cut_to_ring ? analysis.ring_begins_at : 0;
  if (analysis.window.begin != unasked_begin || analysis.window.end != analysis.event_count) {
    document.notes.push_back("limited to events #" + std::to_string(analysis.window.begin) + " to #" +
                             std::to_string(analysis.window.end == 0 ? 0 : analysis.window.end - 1) + " of " +
                             std::to_string(analysis.event_count));
  }
}

}  // namespace detail

std::string frame_text(const Snapshot& snapshot, snapshot::FrameId id) {
  if (id.value >= snapshot.frames.size()) return "<bad frame>";
  const snapshot::Frame& frame = snapshot.frames[id.value];
  auto text = [&](snapshot::StringId s) -> std::string {
    return s.value < snapshot.strings.size() ? snapshot.strings[s.value] : std::string();
  };
  const std::string function = text(frame.function);
  const std::string file = text(frame.file);
  if (function.empty()) {
    const std::string module = text(frame.module);
    return format_address(frame.ip) + (module.empty() ? "" : " (" + module + ")");
  }
  if (file.empty()) return function;
  // Appended piece by piece: g++ 12 at -O3 misreads `":" + to_string(...)`
  // as an overlapping copy (-Wrestrict).
  std::string result = function;
  result += " (";
  result += file;
  if (frame.line != 0) {
    result += ':';
    result += std::to_string(frame.line);
  }
  result += ')';
  return result;
}

std::string phase_text(const Snapshot& snapshot, const std::vector<snapshot::StringId>& phase) {
  std::string text;
  for (const snapshot::StringId id : phase) {
    if (!text.empty()) text += '/';
    text += id.value < snapshot.strings.size() ? snapshot.strings[id.value] : std::string("?");
  }
  return text;
}

}  // namespace cachealloc::analyzer
