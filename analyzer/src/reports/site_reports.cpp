// peak, top, leaks and oom: who held the memory.
#include <algorithm>
#include <map>

#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/policy.hpp"
#include "reports/category_sections.hpp"
#include "reports/report_helpers.hpp"

namespace cachealloc::analyzer {

using snapshot::Snapshot;
using snapshot::StackId;

namespace {

// Free device memory that a reservation can fail with anyway: the driver
// refused one with 3.125 MiB to spare on the H200 (docs/VERIFICATION.md,
// "The driver's margin near a full device varies between processes"). Far
// more than that free means cudaMalloc did not fail.
constexpr std::uint64_t kDriverMargin = std::uint64_t{64} << 20;

constexpr std::size_t kDefaultSiteLimit = 20;

struct SiteGroup {
  StackId stack{};
  std::uint64_t bytes = 0;
  std::uint64_t requested = 0;
  std::uint64_t blocks = 0;
  std::uint64_t largest = 0;
};

// Live blocks grouped by site, largest total first; `blocks` sorted by size.
std::vector<SiteGroup> group_by_site(const std::vector<Replay::LiveBlock>& blocks, SiteNamer& names) {
  std::map<std::uint32_t, SiteGroup> groups;
  for (const Replay::LiveBlock& b : blocks) {
    const snapshot::StackId site = names.representative(b.stack);
    SiteGroup& g = groups[site.value];
    g.stack = site;
    g.bytes += b.size;
    g.requested += b.requested;
    ++g.blocks;
    g.largest = std::max(g.largest, b.size);
  }
  std::vector<SiteGroup> result;
  for (const auto& [stack, group] : groups) result.push_back(group);
  std::sort(result.begin(), result.end(), [](const SiteGroup& x, const SiteGroup& y) {
    return x.bytes != y.bytes ? x.bytes > y.bytes : x.stack < y.stack;
  });
  return result;
}

void sort_largest_first(std::vector<Replay::LiveBlock>& blocks) {
  std::sort(blocks.begin(), blocks.end(), [](const Replay::LiveBlock& x, const Replay::LiveBlock& y) {
    return x.size != y.size ? x.size > y.size : x.address < y.address;
  });
}

std::vector<Replay::LiveBlock> live_blocks(const Replay& replay, std::uint64_t min_size) {
  std::vector<Replay::LiveBlock> blocks;
  replay.for_each_allocated([&](const Replay::LiveBlock& b) {
    if (b.size >= min_size) blocks.push_back(b);
  });
  sort_largest_first(blocks);
  return blocks;
}

std::vector<Column> site_columns() {
  return {{"rank", "#", Unit::count},     {"bytes", "bytes", Unit::bytes},   {"share", "share", Unit::ratio},
          {"allocations", "allocs", Unit::count}, {"requested", "requested", Unit::bytes},
          {"largest", "largest", Unit::bytes}, {"stack", "site"}};
}

double share_of(std::uint64_t part, std::uint64_t total) {
  return total == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(total);
}

// "... and 12 more sites": the label of a listing's rest row.
std::string more_text(std::size_t count, const std::string& what) {
  return "... and " + std::to_string(count) + " more " + what + (count == 1 ? "" : "s");
}

// Rows listed of `size` under `limit` (0: all): a rest row standing for a
// single row would only hide it.
std::size_t listed_rows(std::size_t size, std::size_t limit) {
  return limit == 0 || size <= limit || size - limit == 1 ? size : limit;
}

// The largest `limit` sites (0: all), then the rest summed in one row.
void add_site_rows(Table& table, SiteNamer& names, const std::vector<SiteGroup>& groups,
                   std::uint64_t total, std::size_t limit) {
  const std::size_t listed = listed_rows(groups.size(), limit);
  for (std::size_t i = 0; i < listed; ++i) {
    const SiteGroup& g = groups[i];
    table.rows.push_back({static_cast<std::uint64_t>(i + 1), g.bytes, share_of(g.bytes, total), g.blocks,
                          g.requested, g.largest, names.lines(g.stack)});
  }
  if (listed == groups.size()) return;
  SiteGroup rest;
  for (std::size_t i = listed; i < groups.size(); ++i) {
    rest.bytes += groups[i].bytes;
    rest.requested += groups[i].requested;
    rest.blocks += groups[i].blocks;
    rest.largest = std::max(rest.largest, groups[i].largest);
  }
  table.rest = TableRest{groups.size() - listed,
                         {Value{}, rest.bytes, share_of(rest.bytes, total), rest.blocks, rest.requested, rest.largest,
                          more_text(groups.size() - listed, "site")}};
}

std::vector<Column> allocation_columns() {
  return {{"address", "address", Unit::address}, {"size", "size", Unit::bytes},
          {"requested", "requested", Unit::bytes}, {"site", "site"}};
}

}  // namespace

Document peak_report(EventSource& source, const ReportOptions& options) {
  const Snapshot& snapshot = source.head();
  SiteNamer names(snapshot, options.sites);
  // The categories walk follows the analysis's replay: its sums at the
  // allocated peak need no walk of their own.
  // So does the live set at the peak, for the per-allocation listing,
  // unless the pass could not keep it: then a second pass replays to it.
  AnalysisOptions analysis = detail::analysis_options(options);
  analysis.categories = true;
  // The walk sums the allocated peak itself; the reserved one is looked up
  // in its kept changes.
  analysis.category_changes = options.peak_reserved;
  analysis.live_at_peak =
      options.peak_reserved ? AnalysisOptions::LiveAtPeak::reserved : AnalysisOptions::LiveAtPeak::allocated;
  Analysis a = analyze(source, analysis);
  const Peak& peak = options.peak_reserved ? a.peak_reserved : a.peak_allocated;
  const char* metric = options.peak_reserved ? "reserved" : "allocated";
  std::vector<Replay::LiveBlock> blocks;
  const std::size_t until = peak.event == kNoEvent ? (a.window.begin == 0 ? kNoEvent : a.window.begin - 1) : peak.event;
  if (a.live_at_peak) {
    blocks = std::move(*a.live_at_peak);
    sort_largest_first(blocks);
  } else {
    replay_to(source, a.device, until, [&](const Replay& replay) { blocks = live_blocks(replay, 0); }, options.progress);
  }
  const std::vector<SiteGroup> groups = group_by_site(blocks, names);
  std::uint64_t live = 0;
  for (const auto& b : blocks) live += b.size;
  // The largest sites answer "who held the memory"; a run holds hundreds of
  // allocations then, so every one is listed only when asked (limit max).
  const std::size_t limit = options.limit != 0 ? options.limit : kDefaultSiteLimit;

  Document doc;
  doc.report = "peak";
  doc.title = detail::title(snapshot, a.device, std::string("peak ") + metric);
  doc.csv_table = "sites";
  doc.group("", "the moment")
      .add("metric", "metric", std::string(metric))
      .add("peak_bytes", std::string("peak ") + metric, peak.bytes, Unit::bytes, a.truncated())
      .add("event", "after event", detail::event_value(peak.event), Unit::event)
      .add("time_ns", "time", detail::since_origin(a, peak.time_ns), Unit::time)
      .add("phase", "phase", phase_text(snapshot, peak.phase))
      .add("allocated_bytes", "allocated then", live, Unit::bytes)
      .add("allocation_count", "allocations live then", static_cast<std::uint64_t>(blocks.size()), Unit::count)
      .add("site_count", "sites", static_cast<std::uint64_t>(groups.size()), Unit::count);
  CategorizeOptions at_until = detail::from_start_of(a);  // a walk of its own (several analysis threads) sums it
  at_until.moments = {until};
  at_until.max_kept_changes = 0;
  const std::shared_ptr<const Categorization> categorized = detail::categories_of(source, a, at_until);
  const Categorization& categories = *categorized;
  detail::add_category_table(doc, "categories", "live allocations by category (" + detail::category_source(categories) + ")",
                             {{"bytes", "bytes", Unit::bytes}}, {categories.at(until)}, categories);
  doc.notes.push_back(detail::category_note(detail::category_source(categories)));
  Table& sites = doc.table("sites", "live allocations by site, largest first", site_columns());
  add_site_rows(sites, names, groups, live, limit);
  const std::size_t listed = listed_rows(blocks.size(), limit);
  Table& list = doc.table("allocations",
                          listed == blocks.size() ? "every live allocation, largest first"
                                                  : "the " + std::to_string(listed) + " largest live allocations",
                          allocation_columns());
  for (std::size_t i = 0; i < listed; ++i) {
    const auto& b = blocks[i];
    list.rows.push_back({b.address, b.size, b.requested, names.site(b.stack)});
  }
  if (listed != blocks.size()) {
    std::uint64_t bytes = 0, requested = 0;
    for (std::size_t i = listed; i < blocks.size(); ++i) {
      bytes += blocks[i].size;
      requested += blocks[i].requested;
    }
    list.rest = TableRest{blocks.size() - listed, {Value{}, bytes, requested, more_text(blocks.size() - listed, "allocation")}};
  }
  if (listed != blocks.size() || sites.rest) {
    const char* what = listed == blocks.size() ? "sites" : sites.rest ? "sites and allocations" : "allocations";
    doc.notes.push_back("the " + std::to_string(limit) + " largest " + what + " are listed: --all lists every one");
  }
  for (std::string& note : names.notes()) doc.notes.push_back(std::move(note));
  detail::add_common_notes(doc, snapshot, a);
  return doc;
}

Document top_report(EventSource& source, const ReportOptions& options) {
  const Snapshot& snapshot = source.head();
  SiteNamer names(snapshot, options.sites);
  const Analysis a = analyze(source, detail::analysis_options(options));
  // Stacks that print the same are one site: their figures add up.
  std::map<std::uint32_t, SiteFigures> merged;
  for (const SiteFigures& s : a.sites) {
    if (s.allocs == 0 && s.bytes_at_peak_allocated == 0 && s.live_bytes_at_end == 0) continue;
    const snapshot::StackId site = names.representative(s.stack);
    SiteFigures& m = merged[site.value];
    m.stack = site;
    m.allocs += s.allocs;
    m.alloc_bytes += s.alloc_bytes;
    m.requested_bytes += s.requested_bytes;
    m.bytes_at_peak_allocated += s.bytes_at_peak_allocated;
    m.blocks_at_peak_allocated += s.blocks_at_peak_allocated;
    m.bytes_at_peak_reserved += s.bytes_at_peak_reserved;
    m.blocks_at_peak_reserved += s.blocks_at_peak_reserved;
    m.live_bytes_at_end += s.live_bytes_at_end;
    m.live_blocks_at_end += s.live_blocks_at_end;
  }
  std::vector<const SiteFigures*> sites;
  for (const auto& [stack, figures] : merged) sites.push_back(&figures);
  auto key = [&](const SiteFigures* s) -> std::uint64_t {
    switch (options.order) {
      case ReportOptions::SiteOrder::count: return s->allocs;
      case ReportOptions::SiteOrder::peak: return s->bytes_at_peak_allocated;
      case ReportOptions::SiteOrder::bytes: break;
    }
    return s->alloc_bytes;
  };
  std::sort(sites.begin(), sites.end(), [&](const SiteFigures* x, const SiteFigures* y) {
    return key(x) != key(y) ? key(x) > key(y) : x->stack < y->stack;
  });
  static constexpr const char* kOrder[] = {"bytes allocated over the run", "allocation count",
                                           "bytes at the allocated peak"};

  Document doc;
  doc.report = "top";
  doc.title = detail::title(snapshot, a.device, "top sites");
  const bool lower = a.truncated();
  Table& table = doc.table("sites", std::string("sites by ") + kOrder[static_cast<int>(options.order)],
                           {{"rank", "#", Unit::count},
                            {"allocations", "allocs", Unit::count},
                            {"allocated_over_run", "allocated over run", Unit::bytes},
                            {"bytes_at_peak", "at peak", Unit::bytes},
                            {"share_of_peak", "of peak", Unit::ratio},
                            {"live_at_end", "live at end", Unit::bytes},
                            {"stack", "site"}});
  // Counts and bytes over the run miss what the lost events allocated.
  table.columns[1].lower_bound = table.columns[2].lower_bound = lower;
  const std::size_t limit = options.limit != 0 ? options.limit : kDefaultSiteLimit;
  const std::size_t listed = listed_rows(sites.size(), limit);
  for (std::size_t i = 0; i < listed; ++i) {
    const SiteFigures& s = *sites[i];
    table.rows.push_back({static_cast<std::uint64_t>(i + 1), s.allocs, s.alloc_bytes, s.bytes_at_peak_allocated,
                          share_of(s.bytes_at_peak_allocated, a.peak_allocated.bytes), s.live_bytes_at_end,
                          names.lines(s.stack)});
  }
  if (listed != sites.size()) {
    SiteFigures rest;
    for (std::size_t i = listed; i < sites.size(); ++i) {
      rest.allocs += sites[i]->allocs;
      rest.alloc_bytes += sites[i]->alloc_bytes;
      rest.bytes_at_peak_allocated += sites[i]->bytes_at_peak_allocated;
      rest.live_bytes_at_end += sites[i]->live_bytes_at_end;
    }
    table.rest = TableRest{sites.size() - listed,
                           {Value{}, rest.allocs, rest.alloc_bytes, rest.bytes_at_peak_allocated,
                            share_of(rest.bytes_at_peak_allocated, a.peak_allocated.bytes), rest.live_bytes_at_end,
                            more_text(sites.size() - listed, "site")}};
    doc.notes.push_back("the " + std::to_string(limit) + " largest sites are listed: --limit 0 lists every one");
  }
  for (std::string& note : names.notes()) doc.notes.push_back(std::move(note));
  if (lower && !detail::dropped_mid_stream(snapshot))
    doc.notes.push_back("allocation counts and bytes cover the ring only: lower bounds for the run");
  detail::add_common_notes(doc, snapshot, a);
  return doc;
}

Document leaks_report(EventSource& source, const ReportOptions& options) {
  const Snapshot& snapshot = source.head();
  SiteNamer names(snapshot, options.sites);
  AnalysisOptions analysis = detail::analysis_options(options);
  std::vector<Replay::LiveBlock> blocks;
  analysis.at_end = [&](const Replay& replay) { blocks = live_blocks(replay, options.min_size); };
  const Analysis a = analyze(source, analysis);
  const std::vector<SiteGroup> groups = group_by_site(blocks, names);
  std::uint64_t live = 0;
  for (const auto& b : blocks) live += b.size;

  Document doc;
  doc.report = "leaks";
  doc.title = detail::title(snapshot, a.device, "allocations live " + detail::moment(snapshot, a));
  doc.csv_table = "allocations";
  doc.group("", "still allocated " + detail::moment(snapshot, a))
      .add("allocation_count", "allocations", static_cast<std::uint64_t>(blocks.size()), Unit::count)
      .add("bytes", "bytes", live, Unit::bytes)
      .add("min_size", "smallest listed", options.min_size, Unit::bytes);
  Table& sites = doc.table("sites", "by site, largest first", site_columns());
  add_site_rows(sites, names, groups, live, options.limit);
  Table& list = doc.table("allocations", "allocations, largest first", allocation_columns());
  for (std::size_t i = 0; i < detail::listed(blocks.size(), options.limit); ++i) {
    const auto& b = blocks[i];
    list.rows.push_back({b.address, b.size, b.requested, names.site(b.stack)});
  }
  for (std::string& note : names.notes()) doc.notes.push_back(std::move(note));
  detail::add_common_notes(doc, snapshot, a);
  return doc;
}

Document oom_report(EventSource& source, const ReportOptions& options) {
  const Snapshot& snapshot = source.head();
  SiteNamer names(snapshot, options.sites);
  const Analysis a = analyze(source, detail::analysis_options(options));
  Document doc;
  doc.report = "oom";
  doc.title = detail::title(snapshot, a.device, std::to_string(a.ooms.size()) + " out-of-memory event(s)");
  doc.csv_table = "ooms";
  Table& table = doc.table("ooms", "out-of-memory events",
                           {{"event", "event", Unit::event},
                            {"time_ns", "time", Unit::time},
                            {"phase", "phase"},
                            {"requested", "requested", Unit::bytes},
                            {"allocated", "allocated", Unit::bytes},
                            {"reserved", "reserved", Unit::bytes},
                            {"cap", "cap", Unit::bytes},
                            {"device_free", "device free", Unit::bytes},
                            {"process_used", "this process (nvidia-smi)", Unit::bytes},
                            {"other_processes_used", "other processes", Unit::bytes},
                            {"largest_free", "largest free", Unit::bytes},
                            {"releasable_by_empty_cache", "releasable by empty_cache", Unit::bytes},
                            {"empty_cache_helps", "empty_cache helps"},
                            {"verdict", "verdict"}});
  Table& holders = doc.table("sites", "sites holding the most memory at each OOM",
                             {{"event", "oom event", Unit::event},
                              {"rank", "#", Unit::count},
                              {"bytes", "bytes", Unit::bytes},
                              {"allocations", "allocs", Unit::count},
                              {"stack", "site"}});
  Text& explain = doc.text("explanation", "verdicts");
  // NVML's readings at OOMs (format version 5): what nvidia-smi showed then.
  const std::vector<snapshot::DeviceUsage>* readings = nullptr;
  for (const snapshot::DeviceInfo& info : snapshot.devices)
    if (info.index == a.device) readings = &info.usage;
  const auto reading_at = [&](std::size_t event) -> const snapshot::DeviceUsage* {
    if (!readings) return nullptr;
    for (const snapshot::DeviceUsage& u : *readings)
      if (u.event == event) return &u;
    return nullptr;
  };
  for (const OomRecord& oom : a.ooms) {
    const snapshot::DeviceUsage* usage = reading_at(oom.event);
    const std::uint64_t limit_device = oom.totals.reserved + oom.device_free;
    const std::uint64_t limit = oom.cap != 0 ? std::min(oom.cap, limit_device) : limit_device;
    const std::uint64_t demand = oom.totals.allocated + oom.requested;
    // With no cap in the file, the device had room for the request's segment
    // (with a margin for the driver's own), so cudaMalloc was not what
    // failed: the run had a cap the file does not record (PyTorch's pickles
    // store no set_per_process_memory_fraction).
    const std::uint64_t segment = (oom.requested + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
    const bool unrecorded_cap = oom.cap == 0 && oom.device_free >= segment + kDriverMargin;
    // Freeing the cache helps when there is cache to free, and the request
    // then fits on the device and under the cap; unknown under a cap the
    // file does not give.
    const bool helps = oom.cache.releasable > 0 && oom.device_free + oom.cache.releasable >= oom.requested &&
                       (oom.cap == 0 || oom.totals.reserved - oom.cache.releasable + oom.requested <= oom.cap);
    std::string verdict;
    std::string why;
    if (demand > limit_device) {
      verdict = "real demand";
      why = "live allocations + the request (" + format_bytes(demand) + ") exceed reserved + device free (" +
            format_bytes(limit_device) + ")";
    } else if (oom.cap != 0 && demand > oom.cap) {
      verdict = "the cap";
      why = "the device had room, but live allocations + the request (" + format_bytes(demand) +
            ") exceed the allocator cap (" + format_bytes(oom.cap) + ")";
    } else if (unrecorded_cap) {
      verdict = "a cap not in the file";
      why = "the device had " + format_bytes(oom.device_free) + " free, room for the request (" +
            format_bytes(oom.requested) + "), so the allocator stopped at a cap the file does not record "
            "(torch.cuda.set_per_process_memory_fraction): above reserved (" + format_bytes(oom.totals.reserved) +
            ") and below reserved + the request (" + format_bytes(oom.totals.reserved + segment) +
            "); replay and recommend take it with --capacity";
    } else {
      verdict = "fragmentation";
      why = "enough memory in total (" + format_bytes(limit) + " >= " + format_bytes(demand) +
            "), but the largest free block was " + format_bytes(oom.cache.largest_free);
    }
    table.rows.push_back({static_cast<std::uint64_t>(oom.event), detail::since_origin(a, oom.time_ns),
                          phase_text(snapshot, oom.phase), oom.requested, oom.totals.allocated, oom.totals.reserved,
                          oom.cap == 0 ? Value{} : Value{oom.cap}, oom.device_free,
                          usage && usage->process_found ? Value{usage->process_used} : Value{},
                          usage ? Value{usage->other_processes_used} : Value{}, oom.cache.largest_free,
                          oom.cache.releasable, unrecorded_cap ? Value{} : Value{helps}, verdict});
    // Memory the allocator never saw, from nvidia-smi's figures: part of why the device was full.
    std::string beside;
    if (usage && usage->process_found && usage->process_used >= oom.totals.reserved) {
      beside = "; beside the allocator, this process held " + format_bytes(usage->process_used - oom.totals.reserved) +
               " (CUDA context and other allocators)";
      if (usage->other_processes != 0)
        beside += " and " + std::to_string(usage->other_processes) + " other process(es) " +
                  format_bytes(usage->other_processes_used);
      beside += ", by nvidia-smi's figures";
    }
    explain.lines.push_back("#" + std::to_string(oom.event) + ": " + verdict + ": " + why + beside +
                            (helps && !unrecorded_cap ? "; empty_cache() first would have let it succeed." : "."));
    for (std::size_t i = 0; i < oom.top_sites.size(); ++i) {
      const SiteBytes& s = oom.top_sites[i];
      holders.rows.push_back({static_cast<std::uint64_t>(oom.event), static_cast<std::uint64_t>(i + 1), s.bytes,
                              static_cast<std::uint64_t>(s.blocks), names.lines(s.stack)});
    }
  }
  for (std::string& note : names.notes()) doc.notes.push_back(std::move(note));
  detail::add_common_notes(doc, snapshot, a);
  return doc;
}

std::optional<ExportTable> parse_export_table(const std::string& name) noexcept {
  if (name == "timeline") return ExportTable::timeline;
  if (name == "events") return ExportTable::events;
  if (name == "segments") return ExportTable::segments;
  if (name == "sites") return ExportTable::sites;
  return std::nullopt;
}

Document export_report(EventSource& source, ExportTable what, const ReportOptions& options) {
  Document doc;
  switch (what) {
    case ExportTable::timeline: doc = timeline_report(source, options); break;
    case ExportTable::events: doc = events_report(source, options); break;
    case ExportTable::segments:
      doc = segments_report(source, options);
      doc.csv_table = "blocks";
      break;
    case ExportTable::sites: {
      ReportOptions all = options;
      if (all.limit == 0) all.limit = std::numeric_limits<std::size_t>::max();
      doc = top_report(source, all);
      break;
    }
  }
  doc.report = "export";
  return doc;
}

Document peak_report(const Snapshot& snapshot, const ReportOptions& options) {
  SnapshotEvents source(snapshot);
  return peak_report(source, options);
}

Document top_report(const Snapshot& snapshot, const ReportOptions& options) {
  SnapshotEvents source(snapshot);
  return top_report(source, options);
}

Document leaks_report(const Snapshot& snapshot, const ReportOptions& options) {
  SnapshotEvents source(snapshot);
  return leaks_report(source, options);
}

Document oom_report(const Snapshot& snapshot, const ReportOptions& options) {
  SnapshotEvents source(snapshot);
  return oom_report(source, options);
}

Document export_report(const Snapshot& snapshot, ExportTable what, const ReportOptions& options) {
  SnapshotEvents source(snapshot);
  return export_report(source, what, options);
}

}  // namespace cachealloc::analyzer
