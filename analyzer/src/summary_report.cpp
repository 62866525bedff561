#include "cachealloc/analyzer/reports.hpp"
#include "report_helpers.hpp"

namespace cachealloc::analyzer {

using snapshot::Snapshot;

namespace {

std::string percent(double ratio) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f%%", ratio * 100.0);
  return buffer;
}

std::string pad(std::string text, std::size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

}  // namespace

Document summary_report(EventSource& source, const ReportOptions& options) {
  const Snapshot& snapshot = source.head();
  const Analysis a = analyze(source, detail::analysis_options(options));
  const bool lower = a.truncated();
  Document doc;
  doc.report = "summary";
  doc.title = detail::title(snapshot, a.device, "summary");
  doc.csv_fields = true;

  snapshot::DeviceInfo device;
  for (const snapshot::DeviceInfo& info : snapshot.devices) {
    if (info.index == a.device) device = info;
  }
  const std::uint64_t total = device.driver_total_at_dump != 0 ? device.driver_total_at_dump : device.total_bytes;
  const bool driver_known = total != 0 && device.driver_free_at_dump <= total;
  const std::uint64_t used = driver_known ? total - device.driver_free_at_dump : 0;

  FieldGroup& overview = doc.group("", "device " + std::to_string(a.device) + " at the end");
  overview.add("device_total", "device total", device.total_bytes, Unit::bytes)
      .add("device_free_at_dump", "free at dump (driver)", device.driver_free_at_dump, Unit::bytes)
      .add("reserved_at_end", "reserved", a.totals_at_end.reserved, Unit::bytes)
      .add("allocated_at_end", "allocated", a.totals_at_end.allocated, Unit::bytes)
      .add("segments_at_end", "segments", static_cast<std::uint64_t>(a.segments_at_end), Unit::count)
      .add("dropped_events", "events lost to ring overflow", a.dropped_events, Unit::count);

  Text& gap = doc.text("gap", "from allocated to device used");
  const Totals& t = a.totals_at_end;
  gap.lines.push_back(pad("allocated", 12) + pad(format_bytes(t.allocated), 12) +
                      "held by live allocations (rounding waste in active blocks: " +
                      format_bytes(a.cache_at_end.rounding_waste) + ")");
  gap.lines.push_back(pad("reserved", 12) + pad(format_bytes(t.reserved), 12) + "allocated + " +
                      format_bytes(a.cache_at_end.free_in_cache) + " cached free in the allocator (" +
                      format_bytes(a.cache_at_end.cached_unsplit) + " releasable by empty_cache)");
  if (driver_known) {
    const std::string outside = used >= t.reserved ? format_bytes(used - t.reserved) + " outside the allocator"
                                                   : "less than reserved: the driver figure is stale";
    gap.lines.push_back(pad("device used", 12) + pad(format_bytes(used), 12) + "reserved + " + outside +
                        " (CUDA context, other allocators and processes)");
  } else {
    gap.lines.push_back(pad("device used", 12) + pad("unknown", 12) + "the snapshot has no driver figures");
  }

  Table& peaks = doc.table("peaks", std::string("peaks") + (lower ? " (lower bounds: the trace does not cover the whole run)" : ""),
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

  FieldGroup& counts = doc.group("events", std::string("events in the ring") + (lower ? " (lower bounds)" : ""));
  for (int k = 0; k < snapshot::kEventKindCount; ++k) {
    const auto kind = static_cast<snapshot::EventKind>(k);
    counts.add(snapshot::to_string(kind), snapshot::to_string(kind), a.counts[static_cast<std::size_t>(k)],
               Unit::count, lower);
  }

  const CacheFigures& f = a.cache_at_end;
  FieldGroup& frag = doc.group("fragmentation", "fragmentation at the end");
  std::string headline = percent(f.external_fragmentation()) + " external: the largest free block is " +
                         format_bytes(f.largest_free) + " of " + format_bytes(f.inactive) + " free";
  if (f.cached_unsplit != 0) headline += "; empty_cache() would return " + format_bytes(f.cached_unsplit);
  frag.add("headline", "headline", headline)
      .add("external_fragmentation", "external fragmentation", f.external_fragmentation(), Unit::ratio)
      .add("largest_free_block", "largest free block", f.largest_free, Unit::bytes)
      .add("free_in_cache", "free in cache", f.free_in_cache, Unit::bytes)
      .add("rounding_waste", "rounding waste", f.rounding_waste, Unit::bytes)
      .add("inactive_split", "inactive split bytes", f.inactive_split, Unit::bytes)
      .add("cached_unsplit", "cached-but-free bytes", f.cached_unsplit, Unit::bytes)
      .add("pending_free", "pending frees", f.pending_free, Unit::bytes);

  if (a.dropped_events > 0) {
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
