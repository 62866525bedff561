#include "cachealloc/analyzer/reports.hpp"
#include "reports/category_sections.hpp"
#include "reports/report_helpers.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "cachealloc/snapshot/stream.hpp"

#include <optional>

namespace cachealloc::analyzer {

using snapshot::Snapshot;

namespace {

std::string percent(double ratio) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f%%", ratio * 100.0);
  return buffer;
}

}  // namespace

Document summary_report(EventSource& source, const ReportOptions& options) {
  const Snapshot& snapshot = source.head();
  AnalysisOptions analysis = detail::analysis_options(options);
  analysis.categories = true;
  analysis.category_changes = false;  // the peak and the end only, which the walk sums
  const Analysis a = analyze(source, analysis);
  const bool lower = a.truncated();
  Document doc;
  doc.report = "summary";
  doc.title = detail::title(snapshot, a.device, "summary");
  doc.csv_fields = true;

  // The moment the figures describe: after the window's last event.
  const bool at_dump = a.window.end == a.event_count;
  const std::string moment = detail::moment(snapshot, a);
  const Value at_event = a.window.end == 0 ? Value{} : Value{static_cast<std::uint64_t>(a.window.end - 1)};

  // Driver figures exist only where they were measured: at the dump, or at
  // an OOM that carries them, when the window ends there.
  snapshot::DeviceInfo device;
  for (const snapshot::DeviceInfo& info : snapshot.devices) {
    if (info.index == a.device) device = info;
  }
  // A stream that lost its trailer (killed, or still being written) holds
  // neither its count of dropped events nor a reading of the driver at its
  // end: the one it carries was taken when the recording began.
  const bool trailer_missing = snapshot.settings.count(snapshot::kStreamNoteSetting) != 0;
  std::optional<std::uint64_t> total;
  std::optional<std::uint64_t> free;
  if (const std::uint64_t t = device.driver_total_at_dump != 0 ? device.driver_total_at_dump : device.total_bytes; t != 0)
    total = t;
  if (at_dump && !trailer_missing && total && device.driver_free_at_dump <= *total) free = device.driver_free_at_dump;
  if (!at_dump && !a.ooms.empty() && a.ooms.back().event + 1 == a.window.end && total && a.ooms.back().device_free != 0 &&
      a.ooms.back().device_free <= *total) {
    free = a.ooms.back().device_free;
  }
  const auto known = [](const std::optional<std::uint64_t>& v) { return v ? Value{*v} : Value{}; };

  // NVML's reading (what nvidia-smi shows) where one was taken: at the
  // dump, or at an OOM that ends the window.
  const snapshot::DeviceUsage* usage = nullptr;
  for (const snapshot::DeviceUsage& u : device.usage) {
    if ((at_dump && !trailer_missing && u.event == snapshot::kUsageAtDump) || (!at_dump && a.window.end != 0 && u.event == a.window.end - 1))
      usage = &u;
  }

  // PyTorch's ring does not count what it drops: how many a pickle lost is
  // unknown, even where its trace explains the layout from an empty start.
  // Nor does a stream without its trailer, which is where the count is written.
  const Value dropped =
      detail::counts_dropped_events(snapshot) && !trailer_missing ? Value{a.dropped_events} : Value{};
  FieldGroup& overview = doc.group("", "device " + std::to_string(a.device) + " " + moment);
  overview.add("device", "device", static_cast<std::uint64_t>(a.device), Unit::count)
      .json_only_if(true)  // the group's title names it
      .add("at_event", "state after event", at_event, Unit::event)
      .add("driver_total", "device total (torch.cuda.mem_get_info())", known(total), Unit::bytes)
      .add("reserved_at_end", "reserved", a.totals_at_end.reserved, Unit::bytes)
      .add("allocated_at_end", "allocated", a.totals_at_end.allocated, Unit::bytes)
      .add("segments_at_end", "segments", static_cast<std::uint64_t>(a.segments_at_end), Unit::count)
      .add("expandable_segments_at_end", "expandable segments",
           static_cast<std::uint64_t>(a.expandable_segments_at_end), Unit::count)
      .add("dropped_events", "events lost to ring overflow", dropped, Unit::count);
  if (a.ring_begins_at != 0)  // a trace begun mid-run that opens with older annotations
    overview.add("ring_begins_at", "memory recorded from event", static_cast<std::uint64_t>(a.ring_begins_at),
                 Unit::event);

  // The chain of views, one name per quantity (docs/GLOSSARY.md):
  //   allocated + pending frees + cached free = reserved        (the allocator)
  //   reserved + context and other allocators = process used    (nvidia-smi, this process)
  //   process used + other processes          = device used     (nvidia-smi, the device)
  //   device used + driver reserved + free    = device total
  // and, from cudaMemGetInfo where NVML was not read:
  //   reserved + outside the allocator        = driver used (total - free)
  const Totals& t = a.totals_at_end;
  const CacheFigures& c = a.cache_at_end;
  std::optional<std::uint64_t> driver_used;
  std::optional<std::uint64_t> outside;
  if (total && free) {
    driver_used = *total - *free;
    if (*driver_used >= t.reserved) outside = *driver_used - t.reserved;
  }
  std::optional<std::uint64_t> process_used, process_outside, device_used, outside_process, other_used, other_count,
      device_reserved, device_free, device_total;
  if (usage) {
    device_used = usage->device_used;
    device_reserved = usage->device_reserved;
    device_total = usage->device_total;
    device_free = usage->device_total - usage->device_used - usage->device_reserved;
    other_used = usage->other_processes_used;
    other_count = usage->other_processes;
    if (usage->process_found) {
      process_used = usage->process_used;
      if (usage->process_used >= t.reserved) process_outside = usage->process_used - t.reserved;
      if (usage->device_used >= usage->process_used) outside_process = usage->device_used - usage->process_used;
    }
  }
  const bool nvml = usage != nullptr;
  const std::string others = other_count ? "other processes (" + std::to_string(*other_count) + ")" : "other processes";
  // Inside a trace that began mid-run the state comes from a derived start:
  // what it holds is a lower bound (tests/test_pytorch_ground_truth.cpp).
  const bool bound = lower && !at_dump;
  FieldGroup& gap = doc.group("gap", "from allocated to the whole device, " + moment);
  gap.add("allocated", "allocated (torch.cuda.memory_allocated())", t.allocated, Unit::bytes, bound)
      .add("pending_free", "+ pending frees (in use by other streams)", c.pending_free, Unit::bytes)
      .add("rounding_waste", "  rounding waste in these two (active - requested)", c.rounding_waste, Unit::bytes)
      .add("cached_free", "+ cached free", c.cached_free, Unit::bytes)
      .add("inactive_split", "  of which inactive split", c.inactive_split, Unit::bytes)
      .add("releasable_by_empty_cache", "  of which releasable by empty_cache", c.releasable, Unit::bytes)
      .add("reserved", "= reserved (torch.cuda.memory_reserved())", t.reserved, Unit::bytes, bound)
      .add("process_outside_allocator", "+ CUDA context and other allocators in this process", known(process_outside),
           Unit::bytes)
      .json_only_if(!nvml)
      .add("process_used", "= this process on the device (nvidia-smi, this process)", known(process_used), Unit::bytes)
      .json_only_if(!nvml)
      .add("outside_process", "+ " + others + " and memory no process holds", known(outside_process), Unit::bytes)
      .json_only_if(!nvml)
      .add("other_processes_used", "  of which " + others, known(other_used), Unit::bytes)
      .json_only_if(!nvml)
      .add("other_processes", "  other processes", known(other_count), Unit::count)
      .json_only_if(true)
      .add("device_used", "= device used (nvidia-smi memory.used)", known(device_used), Unit::bytes)
      .json_only_if(!nvml)
      .add("device_reserved", "+ reserved by the driver (nvidia-smi memory.reserved)", known(device_reserved), Unit::bytes)
      .json_only_if(!nvml)
      .add("device_free", "+ free (nvidia-smi memory.free)", known(device_free), Unit::bytes)
      .json_only_if(!nvml)
      .add("device_total", "= device total (nvidia-smi memory.total)", known(device_total), Unit::bytes)
      .json_only_if(!nvml)
      .add("outside_allocator", "+ outside the allocator (CUDA context, other allocators and processes)",
           known(outside), Unit::bytes)
      .json_only_if(nvml)
      .add("driver_used", "= used on the device (torch.cuda.mem_get_info(): total - free)", known(driver_used),
           Unit::bytes)
      .json_only_if(nvml)
      .add("driver_free", "driver free (torch.cuda.mem_get_info())", known(free), Unit::bytes)
      .json_only_if(true);
  const std::string event_here = "event #" + std::to_string(a.window.end == 0 ? 0 : a.window.end - 1);
  if (a.expandable_segments_at_end != 0)
    doc.notes.push_back("expandable segments are counted apart: memory_stats()' segment counts leave them out, and "
                        "PyTorch's snapshot lists each once per mapped piece; here each is one reserved address range.");
  if (!total && !nvml) {
    doc.notes.push_back(
        "device figures: unknown, the snapshot holds none (PyTorch's snapshots record neither the driver's nor "
        "NVML's figures).");
  } else if (!free && !nvml && at_dump && trailer_missing) {
    doc.notes.push_back("device figures: unknown at the last event read; the recording ended without its trailer, "
                        "which holds the driver's reading at the end.");
  } else if (!free && !nvml) {
    doc.notes.push_back("device figures: not measured at " + event_here + "; the driver was read at the dump (event #" +
                        std::to_string(a.event_count == 0 ? 0 : a.event_count - 1) + ") and at OOMs.");
  } else if (driver_used && !outside && !nvml) {
    doc.notes.push_back("device figures: the driver reported less in use than reserved; its reading is stale.");
  }
  if (nvml && !usage->process_found) {
    doc.notes.push_back("this process's figure: NVML did not list it (" + device.usage_note + ").");
  } else if (nvml && !process_outside) {
    doc.notes.push_back("this process's figure: NVML reported less for this process than reserved.");
  }
  if (!nvml && device.usage_source == snapshot::UsageSource::unavailable && (at_dump || !a.ooms.empty())) {
    doc.notes.push_back("NVML (nvidia-smi's figures): unavailable when recorded: " + device.usage_note + ".");
  } else if (nvml && device.usage_source == snapshot::UsageSource::simulated) {
    doc.notes.push_back("NVML's figures are the simulated device's model of them.");
  }

  const bool approximate = detail::dropped_mid_stream(snapshot);
  Table& peaks = doc.table("peaks", std::string("peaks") +
                                        (approximate ? " (approximate: events were dropped while the stream was written)"
                                         : lower     ? " (lower bounds: the trace does not cover the whole run)"
                                                     : ""),
                           {{"metric", "metric"},
                            {"bytes", "peak", Unit::bytes},
                            {"event", "event", Unit::event},
                            {"time_ns", "time", Unit::time},
                            {"phase", "phase"}});
  auto peak_row = [&](const char* name, const Peak& peak) {
    peaks.rows.push_back({std::string(name), peak.bytes, detail::event_value(peak.event),
                          detail::since_origin(a, peak.time_ns), phase_text(snapshot, peak.phase)});
  };
  peak_row("allocated", a.peak_allocated);
  peak_row("reserved", a.peak_reserved);
  peak_row("active", a.peak_active);
  peak_row("requested", a.peak_requested);

  FieldGroup& peak_keys = doc.group("", "peaks");
  peak_keys.json_only = true;
  peak_keys.add("peak_allocated", "", a.peak_allocated.bytes, Unit::bytes, lower)
      .add("peak_allocated_event", "", detail::event_value(a.peak_allocated.event), Unit::event)
      .add("peak_reserved", "", a.peak_reserved.bytes, Unit::bytes, lower)
      .add("peak_reserved_event", "", detail::event_value(a.peak_reserved.event), Unit::event)
      .add("peak_active", "", a.peak_active.bytes, Unit::bytes, lower)
      .add("peak_requested", "", a.peak_requested.bytes, Unit::bytes, lower);

  // What allocated is made of, at its peak and at the end.
  CategorizeOptions at_peak_and_end;
  at_peak_and_end.moments = detail::peak_and_end(a);
  at_peak_and_end.start = a.start;
  at_peak_and_end.max_kept_changes = 0;  // the walk sums these two moments itself
  const std::shared_ptr<const Categorization> categorized = detail::categories_of(source, a, at_peak_and_end);
  const Categorization& categories = *categorized;
  std::vector<CategoryBytes> by_category = categories.at(at_peak_and_end.moments);
  if (at_peak_and_end.moments[0] != detail::state_after(a, a.peak_allocated.event)) std::swap(by_category[0], by_category[1]);
  detail::add_category_table(doc, "categories",
                             "categories (" + detail::category_source(categories) + "): allocated at its peak and " + moment,
                             {{"at_peak_allocated", "at the allocated peak", Unit::bytes},
                              {"at_end", "at the end", Unit::bytes}},
                             by_category, categories);
  doc.notes.push_back(detail::category_note(detail::category_source(categories)));

  FieldGroup& counts = doc.group("events", approximate ? std::string("events in the stream (the run had more: some were dropped)")
                                                      : std::string("events in the ring") + (lower ? " (lower bounds)" : ""));
  // Category tags appear only where a program made them: a trace without
  // them (every PyTorch pickle) prints no row for them.
  const auto untagged = [&](snapshot::EventKind kind) {
    return kind == snapshot::EventKind::category && a.counts[static_cast<std::size_t>(kind)] == 0;
  };
  for (int k = 0; k < snapshot::kEventKindCount; ++k) {
    const auto kind = static_cast<snapshot::EventKind>(k);
    if (untagged(kind)) continue;
    const Value count = detail::records_kind(snapshot, kind) ? Value{a.counts[static_cast<std::size_t>(k)]} : Value{};
    counts.add(snapshot::to_string(kind), snapshot::to_string(kind), count, Unit::count, lower);
  }
  std::string unrecorded;
  for (int k = 0; k < snapshot::kEventKindCount; ++k) {
    const auto kind = static_cast<snapshot::EventKind>(k);
    if (!detail::records_kind(snapshot, kind) && !untagged(kind)) unrecorded += (unrecorded.empty() ? "" : ", ") + std::string(snapshot::to_string(kind));
  }
  if (snapshot.header.source == snapshot::kPytorchPickleSource)
    doc.notes.push_back("unknown counts (" + unrecorded +
                        ", events lost to ring overflow): PyTorch's trace records no such events and does not count "
                        "what its ring drops.");

  const CacheFigures& f = a.cache_at_end;
  FieldGroup& frag = doc.group("fragmentation", "fragmentation, " + moment);
  std::string headline = percent(f.external_fragmentation()) + " external: the largest free block is " +
                         format_bytes(f.largest_free) + " of " + format_bytes(f.cached_free) + " cached free";
  if (f.releasable != 0) headline += "; empty_cache() would return " + format_bytes(f.releasable);
  frag.add("headline", "headline", headline)
      .add("external_fragmentation", "external fragmentation", f.external_fragmentation(), Unit::ratio)
      .add("largest_free_block", "largest free block", f.largest_free, Unit::bytes);

  if (a.dropped_events > 0 && !detail::dropped_mid_stream(snapshot)) {
    doc.notes.push_back("warning: the ring overflowed and " + std::to_string(a.dropped_events) +
                        " events were lost; enlarge the ring to see the whole run.");
  }
  if (!a.ooms.empty()) {
    doc.notes.push_back(std::to_string(a.ooms.size()) + " out-of-memory event(s): see `cachealloc-analyze oom`.");
  }
  detail::add_common_notes(doc, snapshot, a);
  return doc;
}

Document summary_report(const Snapshot& snapshot, const ReportOptions& options) {
  SnapshotEvents source(snapshot);
  return summary_report(source, options);
}

}  // namespace cachealloc::analyzer
