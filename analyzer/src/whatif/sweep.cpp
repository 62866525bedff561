#include "cachealloc/analyzer/sweep.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <thread>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/device.hpp"
#include "cachealloc/errors.hpp"
#include "cachealloc/snapshot/detail/cores.hpp"

namespace cachealloc::analyzer {
namespace {

using snapshot::Event;
using snapshot::EventKind;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr const char* kExpandable = "expandable_segments";
constexpr const char* kMaxSplit = "max_split_size_mb";
constexpr const char* kRoundup = "roundup_power2_divisions";
constexpr const char* kGc = "garbage_collection_threshold";

[[noreturn]] void bad_value(const std::string& key, const std::string& value, const char* expected) {
  throw InvalidArgument("--sweep-axis " + key + ": '" + value + "' is not " + expected);
}

// The value as the sweep writes it, or throws naming what was expected.
std::string checked_value(const std::string& key, const std::string& value) {
  if (key == kExpandable) {
    if (value == "True" || value == "true" || value == "1") return "True";
    if (value == "False" || value == "false" || value == "0") return "False";
    bad_value(key, value, "True or False");
  }
  if (key == kMaxSplit) {
    if (value == "unlimited") return value;
    try {
      (void)parse_config(std::string(kMaxSplit) + ":" + value);
    } catch (const ConfigError&) {
      bad_value(key, value, "'unlimited' or a whole number of MiB above 20");
    }
    return std::to_string(std::stoull(value));
  }
  if (key == kRoundup) {
    if (value == "0") return value;
    try {
      (void)parse_config(std::string(kRoundup) + ":" + value);
    } catch (const ConfigError&) {
      bad_value(key, value, "0 or a power of two");
    }
    if (value.front() == '[') bad_value(key, value, "0 or a power of two (the sweep sets every interval alike)");
    return std::to_string(std::stoull(value));
  }
  if (key == kGc) {
    if (value == "off" || value == "0") return "off";
    try {
      (void)parse_config(std::string(kGc) + ":" + value);
    } catch (const ConfigError&) {
      bad_value(key, value, "'off' or a number between 0 and 1 (exclusive)");
    }
    return value;
  }
  throw InvalidArgument("--sweep-axis: '" + key + "' is not a key the sweep can vary (keys: expandable_segments, "
                        "max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold)");
}

// Sets one swept key; the value was checked by checked_value().
void apply(AllocatorConfig& config, const std::string& key, const std::string& value) {
  if (key == kExpandable) {
    config.expandable_segments = value == "True";
  } else if (key == kMaxSplit) {
    config.max_split_size = value == "unlimited" ? std::numeric_limits<std::size_t>::max()
                                                 : static_cast<std::size_t>(std::stoull(value)) * kMiB;
  } else if (key == kRoundup) {
    config.roundup_power2_divisions.fill(static_cast<std::size_t>(std::stoull(value)));
  } else if (key == kGc) {
    config.garbage_collection_threshold = value == "off" ? 0.0 : std::strtod(value.c_str(), nullptr);
  }
}

bool differs(const AllocatorConfig& a, const AllocatorConfig& b, const std::string& key) {
  if (key == kExpandable) return a.expandable_segments != b.expandable_segments;
  if (key == kMaxSplit) return a.max_split_size != b.max_split_size;
  if (key == kRoundup) return a.roundup_power2_divisions != b.roundup_power2_divisions;
  return a.garbage_collection_threshold != b.garbage_collection_threshold;
}

// What the sweep needs of the trace, read in the one decoding pass.
struct TraceFacts {
  std::vector<std::uint64_t> large_requests;  // requested bytes over 20 MiB
  std::uint64_t oom_cap = 0;                   // the first recorded OOM's cap
  bool has_oom = false;
};

// Up to three max_split_size_mb values from the large requests: their
// quartile, median and 90th percentile, rounded up to MiB (above 20).
std::vector<std::string> split_sizes(std::vector<std::uint64_t> sizes) {
  std::vector<std::string> out;
  if (sizes.empty()) return out;
  std::sort(sizes.begin(), sizes.end());
  std::vector<std::uint64_t> mib;
  for (const double q : {0.25, 0.5, 0.9}) {
    const std::uint64_t bytes = sizes[static_cast<std::size_t>(q * static_cast<double>(sizes.size() - 1))];
    const std::uint64_t m = std::max<std::uint64_t>(21, (bytes + kMiB - 1) / kMiB);
    if (std::find(mib.begin(), mib.end(), m) == mib.end()) mib.push_back(m);
  }
  for (const std::uint64_t m : mib) out.push_back(std::to_string(m));
  return out;
}

template <class Visit>
void scan(EventSource& source, std::int32_t device, Visit&& visit) {
  for_each_event(source, 0, source.event_count(), [&](std::size_t, const Event& e) {
    if (e.device == device) visit(e);
    return true;
  });
}

void note_fact(TraceFacts& facts, const Event& e) {
  if (e.kind == EventKind::alloc) {
    const std::uint64_t bytes = e.aux != 0 ? e.aux : e.size;
    if (bytes > 20 * kMiB) facts.large_requests.push_back(bytes);
  } else if (e.kind == EventKind::oom) {
    if (!facts.has_oom) facts.oom_cap = e.aux;
    facts.has_oom = true;
  }
}

OomCapBounds oom_cap_bounds(const OomRecord& oom, std::uint64_t peak_reserved_before) {
  OomCapBounds b;
  b.event = oom.event;
  b.reserved = oom.totals.reserved;
  b.allocated = oom.totals.allocated;
  b.requested = oom.requested;
  // PyTorch's OOM entry records the device's free bytes: room for the
  // request means a cap stopped the allocator.
  b.device_full = oom.device_free != 0 && oom.device_free < oom.requested;
  b.lowest = b.device_full ? b.reserved + oom.device_free : std::max(b.reserved, peak_reserved_before);
  b.highest = b.device_full ? b.lowest + 1 : b.reserved + b.requested;
  return b;
}

std::vector<SweepAxis> axes_from(const TraceFacts& facts, bool capped) {
  std::vector<SweepAxis> axes;
  axes.push_back({kExpandable, {"False", "True"}});
  SweepAxis split{kMaxSplit, {"unlimited"}};
  for (std::string& size : split_sizes(facts.large_requests)) split.values.push_back(std::move(size));
  axes.push_back(std::move(split));
  axes.push_back({kRoundup, {"0", "4", "8"}});
  axes.push_back({kGc, capped ? std::vector<std::string>{"off", "0.8"} : std::vector<std::string>{"off"}});
  return axes;
}

std::string key_of(std::string pair) {
  const auto at = pair.find_first_of("=:");
  return at == std::string::npos ? pair : pair.substr(0, at);
}

// The largest request scale, to 1/64, at which `replay`'s settings fit:
// doubling from 1 while it fits (up to 64), then bisection.
double largest_fitting_scale(EventSource& source, AllocatorReplayOptions replay, const ReplayResult& at_one) {
  auto fits = [&](double scale) {
    replay.scale = scale;
    return !replay_allocator(source, replay).replayed.first_oom.has_value();
  };
  double lo = 0, hi = 1;
  if (!at_one.replayed.first_oom) {
    lo = 1;
    for (hi = 2; hi <= 64 && fits(hi); hi *= 2) lo = hi;
    if (hi > 64) return lo;
  }
  while (hi - lo > 1.0 / 64) {
    const double mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

const std::vector<std::string>& sweep_keys() {
  static const std::vector<std::string> keys{kExpandable, kMaxSplit, kRoundup, kGc};
  return keys;
}

SweepAxis sweep_axis(const std::string& text) {
  const auto at = text.find_first_of("=:");
  if (at == std::string::npos || at == 0)
    throw InvalidArgument("--sweep-axis " + text + ": expected KEY=V1,V2,... (e.g. max_split_size_mb=unlimited,256)");
  SweepAxis axis{text.substr(0, at), {}};
  const std::string list = text.substr(at + 1);
  if (std::find(sweep_keys().begin(), sweep_keys().end(), axis.key) == sweep_keys().end())
    (void)checked_value(axis.key, "");  // throws: names the keys
  std::size_t from = 0;
  while (from <= list.size()) {
    const std::size_t comma = std::min(list.find(',', from), list.size());
    const std::string value = list.substr(from, comma - from);
    if (value.empty()) throw InvalidArgument("--sweep-axis " + text + ": an empty value");
    const std::string checked = checked_value(axis.key, value);
    if (std::find(axis.values.begin(), axis.values.end(), checked) != axis.values.end())
      throw InvalidArgument("--sweep-axis " + text + ": '" + value + "' is listed twice");
    axis.values.push_back(checked);
    from = comma + 1;
  }
  return axis;
}

std::vector<SweepAxis> default_sweep_axes(EventSource& source, std::int32_t device, bool capped) {
  TraceFacts facts;
  scan(source, pick_device(source, device), [&](const Event& e) { note_fact(facts, e); });
  return axes_from(facts, capped);
}

SweepResult sweep(EventSource& source, const SweepOptions& options) {
  const snapshot::Snapshot& head = source.head();
  const std::int32_t device = pick_device(source, options.device);
  if (source.event_count() == 0)
    throw InvalidArgument("the file holds no trace (segments only): there are no requests to replay");
  if (options.fraction && options.capacity) throw InvalidArgument("--fraction and --capacity exclude each other");
  for (const std::string& pair : options.set) {
    const std::string key = key_of(pair);
    if (std::find(sweep_keys().begin(), sweep_keys().end(), key) != sweep_keys().end())
      throw InvalidArgument("--set " + pair + ": the sweep varies " + key + " (fix it with --sweep-axis " + key +
                            "=VALUE instead)");
  }
  for (std::size_t i = 0; i < options.axes.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (options.axes[i].key == options.axes[j].key)
        throw InvalidArgument("--sweep-axis " + options.axes[i].key + " is given twice");

  // One decode: every worker reads this copy through its own view.
  snapshot::Snapshot copy = head;
  copy.events.clear();
  copy.events.reserve(source.event_count());
  TraceFacts facts;
  for_each_event(source, 0, source.event_count(), [&](std::size_t, const Event& e) {
    copy.events.push_back(e);
    if (e.device == device) note_fact(facts, e);
    return true;
  });

  // The cap every replay runs under: the one asked for, else the recorded
  // OOM's (replay_allocator's own default), else, when the run ran out of
  // memory with no cap, the device total.
  AllocatorReplayOptions common;
  common.device = device;
  common.fraction = options.fraction;
  common.capacity = options.capacity;
  common.recorded_fraction = options.recorded_fraction;
  common.placement = options.placement;
  std::uint64_t device_total = simulated_h200_options().capacity;
  for (const auto& info : head.devices)
    if (info.index == device && info.total_bytes != 0) device_total = info.total_bytes;
  // A recorded OOM with no cap in the file (PyTorch's pickles): the OOM
  // bounds the memory the run had; the replays take its lowest value, so a
  // setting that fits there fits whatever the cap was.
  std::optional<OomCapBounds> bounds;
  if (facts.has_oom && facts.oom_cap == 0) {
    SnapshotEvents view(copy);
    AnalysisOptions analysis;
    analysis.device = device;
    const Analysis a = analyze(view, analysis);
    if (!a.ooms.empty()) {
      // Before its OOM the run held its peak reserved under the cap too
      // (the OOM's own figure may follow a release of the cache).
      analysis.window.end = a.ooms.front().event + 1;
      const Analysis before = analyze(view, analysis);
      bounds = oom_cap_bounds(a.ooms.front(), before.peak_reserved.bytes);
    }
  }
  CapSource cap_source = common.fraction || common.capacity ? CapSource::asked
                         : facts.oom_cap != 0                ? CapSource::recorded
                                                             : CapSource::none;
  if (cap_source == CapSource::none && facts.has_oom) {
    if (bounds && bounds->lowest != 0 && bounds->lowest <= device_total) {
      common.capacity = bounds->lowest;
      cap_source = bounds->device_full ? CapSource::device_at_oom : CapSource::oom_bound;
    } else {
      common.capacity = device_total;
      cap_source = CapSource::asked;
    }
  }
  const bool capped = common.fraction || common.capacity || facts.oom_cap != 0;
  if (options.largest_scale && !capped)
    throw InvalidArgument("--largest-batch needs a capacity to fit in: add --capacity or --fraction");

  std::vector<SweepAxis> axes = axes_from(facts, capped);
  for (const SweepAxis& given : options.axes) {
    if (given.key == kGc && !capped &&
        std::any_of(given.values.begin(), given.values.end(), [](const std::string& v) { return v != "off"; }))
      throw InvalidArgument("--sweep-axis " + std::string(kGc) +
                            ": garbage collection acts only under a cap; add --capacity or --fraction");
    for (SweepAxis& axis : axes)
      if (axis.key == given.key) axis.values = given.values;
  }

  // Every point's settings, checked before any replay.
  bool known = true;
  const AllocatorConfig recorded = recorded_settings(head, known);
  const AllocatorConfig base = parse_config(settings_with(to_string(recorded), options.set));
  std::size_t count = 1;
  for (const SweepAxis& axis : axes) count *= axis.values.size();
  std::vector<SweepPoint> points(count);
  std::vector<AllocatorConfig> configs(count, base);
  for (std::size_t i = 0; i < count; ++i) {
    SweepPoint& point = points[i];
    point.index = i;
    std::size_t rest = i;
    std::vector<std::size_t> digits(axes.size());
    for (std::size_t a = axes.size(); a-- > 0;) {
      digits[a] = rest % axes[a].values.size();
      rest /= axes[a].values.size();
    }
    for (std::size_t a = 0; a < axes.size(); ++a) {
      const std::string& value = axes[a].values[digits[a]];
      point.settings.emplace_back(axes[a].key, value);
      apply(configs[i], axes[a].key, value);
    }
    for (const auto& [key, value] : point.settings) {
      if (!differs(configs[i], recorded, key)) continue;
      point.changes += (point.changes.empty() ? "" : ",") + key + ":" + value;
      ++point.changed;
    }
    point.config = to_string(configs[i]);
  }

  // Job 0 is the baseline (the recorded settings), then the grid.
  const unsigned hardware = snapshot::detail::usable_cores();
  const unsigned threads =
      static_cast<unsigned>(std::min<std::size_t>(options.threads == 0 ? hardware : options.threads, count + 1));
  std::vector<ReplayResult> results(count + 1);
  std::vector<std::exception_ptr> errors(count + 1);
  std::vector<std::optional<double>> scales(count);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    SnapshotEvents view(copy);
    for (std::size_t job; !failed.load(std::memory_order_relaxed) && (job = next.fetch_add(1)) <= count;) {
      AllocatorReplayOptions replay = common;
      if (job != 0) replay.config = configs[job - 1];
      try {
        results[job] = replay_allocator(view, replay);
        if (job != 0 && options.largest_scale) scales[job - 1] = largest_fitting_scale(view, replay, results[job]);
      } catch (...) {
        errors[job] = std::current_exception();
        failed = true;
      }
    }
  };
  if (threads <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) pool.emplace_back(work);
    for (std::thread& thread : pool) thread.join();
  }
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);

  SweepResult out;
  out.cap_source = cap_source;
  out.oom_bounds = bounds;
  out.events = copy.events.size();
  out.baseline = std::move(results[0]);
  out.cap = out.baseline.cap;
  out.device_total = out.baseline.device_total;
  out.recorded_config = out.baseline.recorded_config;
  out.axes = axes;
  out.threads = threads;
  for (std::size_t i = 0; i < count; ++i) {
    SweepPoint& point = points[i];
    point.figures = results[i + 1].replayed;
    point.largest_scale = scales[i];
    if (out.cap != 0)
      point.headroom = static_cast<std::int64_t>(out.cap) - static_cast<std::int64_t>(point.figures.peak_reserved);
    point.fits = !point.figures.first_oom.has_value() && (!point.headroom || *point.headroom >= 0);
  }
  std::sort(points.begin(), points.end(), [](const SweepPoint& a, const SweepPoint& b) {
    if (a.largest_scale != b.largest_scale) return a.largest_scale > b.largest_scale;
    if (a.fits != b.fits) return a.fits;
    if (!a.fits && a.figures.first_oom->event != b.figures.first_oom->event)
      return a.figures.first_oom->event > b.figures.first_oom->event;  // got further
    if (a.figures.peak_reserved != b.figures.peak_reserved) return a.figures.peak_reserved < b.figures.peak_reserved;
    if (a.changed != b.changed) return a.changed < b.changed;
    return a.index < b.index;
  });
  out.ranked = std::move(points);
  return out;
}

}  // namespace cachealloc::analyzer
