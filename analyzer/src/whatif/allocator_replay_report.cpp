#include <string>

#include "cachealloc/analyzer/allocator_replay.hpp"
#include "cachealloc/analyzer/analysis.hpp"

namespace cachealloc::analyzer {
namespace {

Value optional_count(const std::optional<std::uint64_t>& value) {
  if (!value) return std::monostate{};
  return *value;
}

std::string oom_text(const std::optional<OomPoint>& oom) {
  if (!oom) return "no";
  if (oom->at_start) return "before the trace (its start holds " + format_bytes(oom->requested) + ", above the cap)";
  std::string text = "at event " + std::to_string(oom->event) + " (" + format_bytes(oom->requested) + ")";
  if (!oom->annotation.empty()) text += " in " + oom->annotation;
  return text;
}


}  // namespace

Document replay_report(const ReplayResult& r) {
  Document doc;
  doc.report = "replay";
  doc.title = "Replay through the allocator on the simulated device";
  FieldGroup& run = doc.group("", "Settings");
  run.add("events", "events", r.events, Unit::count);
  run.add("recorded_config", "recorded settings", r.recorded_config.empty() ? std::string("(defaults)") : r.recorded_config);
  run.add("replayed_config", "replayed settings", r.replayed_config.empty() ? std::string("(defaults)") : r.replayed_config);
  run.add("device_total", "device total (recorded)", r.device_total_known ? Value(r.device_total) : Value(), Unit::bytes);
  run.add("simulated_device_total", "simulated device total", r.device_total, Unit::bytes);
  run.add("cap", "replay's cap", r.cap ? Value(r.cap) : Value(std::monostate{}), Unit::bytes).absent_as("none");
  run.add("recorded_cap", "recorded cap", r.recorded_cap ? Value(r.recorded_cap) : Value(std::monostate{}), Unit::bytes);
  run.add("starts_mid_run", "starts mid-run", r.starts_mid_run);
  run.add("initial_segments", "segments at the ring's start", r.initial_segments, Unit::count);
  run.add("initial_segments_not_rebuilt", "ring-start segments not rebuilt as recorded", r.initial_blocks_not_rebuilt, Unit::count);
  run.add("joined_fragments", "ring-start fragments joined to their block", r.joined_fragments, Unit::count);
  run.add("placed_as_recorded", "reservations placed as recorded", r.placed_as_recorded, Unit::count);
  run.add("inferred_empty_cache", "empty_cache calls inferred", r.inferred_empty_cache, Unit::count);
  run.add("deferred_frees", "frees that waited for streams", r.deferred_frees, Unit::count);

  Table& memory = doc.table("memory", "Memory", {{"figure", "figure", Unit::none},
                                                 {"recorded", "recorded", Unit::bytes},
                                                 {"replayed", "replayed", Unit::bytes}});
  auto bytes_row = [&](const char* name, std::uint64_t a, std::uint64_t b) {
    memory.rows.push_back({std::string(name), a, b});
  };
  bytes_row("peak_reserved", r.recorded.peak_reserved, r.replayed.peak_reserved);
  bytes_row("peak_allocated", r.recorded.peak_allocated, r.replayed.peak_allocated);
  bytes_row("cached_free_at_peak", r.recorded.cached_free_at_peak, r.replayed.cached_free_at_peak);
  bytes_row("largest_free_at_peak", r.recorded.largest_free_at_peak, r.replayed.largest_free_at_peak);
  bytes_row("reserved_at_end", r.recorded.reserved_at_end, r.replayed.reserved_at_end);
  bytes_row("allocated_at_end", r.recorded.allocated_at_end, r.replayed.allocated_at_end);

  Table& counts = doc.table("counts", "Counts", {{"figure", "figure", Unit::none},
                                                 {"recorded", "recorded", Unit::count},
                                                 {"replayed", "replayed", Unit::count}});
  counts.rows.push_back({std::string("segments_at_end"), r.recorded.segments, r.replayed.segments});
  counts.rows.push_back({std::string("device_allocs"), r.recorded.device_allocs, r.replayed.device_allocs});
  counts.rows.push_back({std::string("device_frees"), r.recorded.device_frees, r.replayed.device_frees});
  counts.rows.push_back({std::string("alloc_retries"), optional_count(r.recorded.retries), optional_count(r.replayed.retries)});
  counts.rows.push_back({std::string("ooms"), r.recorded.ooms, r.replayed.ooms});

  FieldGroup& outcome = doc.group("outcome", "Outcome");
  outcome.add("recorded_fragmentation_at_peak", "recorded fragmentation at the peak", r.recorded.fragmentation_at_peak, Unit::ratio);
  outcome.add("replayed_fragmentation_at_peak", "replayed fragmentation at the peak", r.replayed.fragmentation_at_peak, Unit::ratio);
  // kNoEvent: the peak held at the trace's start ("start"; null in JSON), as in summary.
  const auto peak_event = [](std::uint64_t event) { return event == kNoEvent ? Value{} : Value{event}; };
  outcome.add("recorded_peak_reserved_event", "recorded peak reserved at event", peak_event(r.recorded.peak_reserved_event), Unit::event);
  outcome.add("replayed_peak_reserved_event", "replayed peak reserved at event", peak_event(r.replayed.peak_reserved_event), Unit::event);
  outcome.add("recorded_oom", "recorded run out of memory", oom_text(r.recorded.first_oom));
  outcome.add("replayed_oom", "replayed run out of memory", oom_text(r.replayed.first_oom));
  for (const auto* which : {"recorded", "replayed"}) {
    const auto& oom = std::string(which) == "recorded" ? r.recorded.first_oom : r.replayed.first_oom;
    const std::string p = which;
    outcome.add(p + "_oom_event", p + " OOM event", oom && !oom->at_start ? Value(oom->event) : Value(std::monostate{}), Unit::event).json_only_if(true);
    outcome.add(p + "_oom_before_trace", p + " OOM before the trace", Value(oom ? oom->at_start : false)).json_only_if(true);
    outcome.add(p + "_oom_requested", p + " OOM request", oom ? Value(oom->requested) : Value(std::monostate{}), Unit::bytes).json_only_if(true);
    outcome.add(p + "_oom_annotation", p + " OOM annotation", oom && !oom->annotation.empty() ? Value(oom->annotation) : Value(std::monostate{})).json_only_if(true);
  }
  doc.csv_table = "memory";
  doc.notes = r.notes;
  if (r.placement_diverged)
    doc.notes.push_back("the replay reserved differently from the recording after " + std::to_string(r.placed_as_recorded) +
                        " reservations; later ones are placed by the driver address model");
  if (r.starts_mid_run)
    doc.notes.push_back("the trace begins mid-run: both columns cover it from the ring's start, rebuilt as recorded; "
                        "their peaks and counts are the trace's, lower bounds for the whole run, and the figures at "
                        "the end are exact");
  if (!r.recorded.retries) doc.notes.push_back("the recorded run's retries are unknown: the trace does not show them");
  return doc;
}

Document replay_report(EventSource& source, const AllocatorReplayOptions& options) {
  return replay_report(replay_allocator(source, options));
}

}  // namespace cachealloc::analyzer
