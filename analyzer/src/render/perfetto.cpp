// export --what perfetto: Chrome trace-event JSON (the "JSON Array/Object
// Format" that ui.perfetto.dev and chrome://tracing read).
#include <algorithm>
#include <array>
#include <cstdio>
#include <optional>
#include <ostream>
#include <set>
#include <string_view>

#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/snapshot/text.hpp"
#include "reports/report_helpers.hpp"

namespace cachealloc::analyzer {

using snapshot::EventKind;
using snapshot::Snapshot;

namespace {

std::string json_string(std::string_view s) {
  std::string out = "\"";
  snapshot::append_json_string(out, s);
  return out + '"';
}

// Writes the events one per line, commas between them.
class TraceWriter {
 public:
  explicit TraceWriter(std::ostream& out) : out_(out) { out_ << "{\"traceEvents\":[\n"; }
  void event(const std::string& body) {
    out_ << (first_ ? "" : ",\n") << '{' << body << '}';
    first_ = false;
  }
  void finish(const std::string& other) { out_ << "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{" << other << "}}\n"; }

 private:
  std::ostream& out_;
  bool first_ = true;
};

std::string micros(std::uint64_t ns) {
  char text[40];
  std::snprintf(text, sizeof text, "%llu.%03llu", static_cast<unsigned long long>(ns / 1000),
                static_cast<unsigned long long>(ns % 1000));
  return text;
}

constexpr int kCounters = 3;
constexpr std::array<const char*, kCounters> kCounterNames = {"allocated", "reserved", "active"};

std::array<std::uint64_t, kCounters> counters_of(const Totals& t) { return {t.allocated, t.reserved, t.active}; }

// One device's counter tracks: every change, or per bucket its largest value
// (where it was reached) and its last.
class CounterTracks {
 public:
  CounterTracks(TraceWriter& writer, std::int64_t pid, std::int32_t device, std::uint64_t origin)
      : writer_(writer), pid_(pid), origin_(origin) {
    for (int c = 0; c < kCounters; ++c) names_[c] = json_string("cuda:" + std::to_string(device) + " " + kCounterNames[c]);
  }
  void sample(int c, std::uint64_t time_ns, std::uint64_t value) {
    std::uint64_t t = time_ns > origin_ ? time_ns - origin_ : 0;
    t = std::max(t, last_time_[c]);  // never backwards within a track
    if (written_[c] && value == last_value_[c]) return;
    last_time_[c] = t;
    last_value_[c] = value;
    written_[c] = true;
    writer_.event("\"ph\":\"C\",\"name\":" + names_[c] + ",\"pid\":" + std::to_string(pid_) +
                  ",\"tid\":0,\"ts\":" + micros(t) + ",\"args\":{\"bytes\":" + std::to_string(value) + "}");
  }

 private:
  TraceWriter& writer_;
  std::int64_t pid_;
  std::uint64_t origin_;
  std::array<std::string, kCounters> names_;
  std::array<std::uint64_t, kCounters> last_time_{};
  std::array<std::uint64_t, kCounters> last_value_{};
  std::array<bool, kCounters> written_{};
};

struct Bucket {
  std::array<std::uint64_t, kCounters> max{}, max_time{}, last{}, last_time{};
  bool any = false;
};

const char* instant_name(EventKind kind) {
  switch (kind) {
    case EventKind::oom: return "oom";
    case EventKind::empty_cache: return "empty_cache";
    case EventKind::segment_alloc: return "segment_alloc";
    case EventKind::segment_release: return "segment_release";
    default: return nullptr;
  }
}

std::string instant_args(const snapshot::Event& e) {
  switch (e.kind) {
    case EventKind::oom:
      return "\"requested\":" + std::to_string(e.size) + ",\"device_free\":" + std::to_string(e.address) +
             ",\"cap\":" + std::to_string(e.aux);
    case EventKind::empty_cache: return "\"released\":" + std::to_string(e.size);
    default: return "\"address\":" + std::to_string(e.address) + ",\"size\":" + std::to_string(e.size);
  }
}

}  // namespace

void write_perfetto_trace(EventSource& source, const ReportOptions& options, std::size_t buckets, std::ostream& out) {
  const Snapshot& snapshot = source.head();
  std::set<std::int32_t> devices;
  if (options.device >= 0) {
    devices.insert(options.device);
  } else {
    for (const snapshot::DeviceInfo& info : snapshot.devices) devices.insert(info.index);
    for (const snapshot::Segment& segment : snapshot.segments) devices.insert(segment.device);
    devices.insert(pick_device(source, -1));
  }
  const std::int64_t pid = snapshot.header.pid > 0 ? snapshot.header.pid : 1;
  constexpr int kAnnotationTid = 1;
  auto events_tid = [](std::int32_t device) { return 10 + device; };

  TraceWriter writer(out);
  const std::string program = snapshot.header.program.empty() ? std::string("unknown program") : snapshot.header.program;
  writer.event("\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(pid) +
               ",\"tid\":0,\"ts\":0,\"args\":{\"name\":" + json_string(program) + "}");
  writer.event("\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(pid) + ",\"tid\":" +
               std::to_string(kAnnotationTid) + ",\"ts\":0,\"args\":{\"name\":\"annotations\"}");

  std::string other;
  bool first_device = true;
  for (const std::int32_t device : devices) {
    ReportOptions device_options = options;
    device_options.device = device;
    const Analysis a = analyze(source, detail::analysis_options(device_options));
    const std::uint64_t origin = a.time_origin_ns;
    writer.event("\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(pid) + ",\"tid\":" +
                 std::to_string(events_tid(device)) + ",\"ts\":0,\"args\":{\"name\":" +
                 json_string("cuda:" + std::to_string(device) + " events") + "}");
    if (!other.empty()) other += ',';
    other += json_string("cuda:" + std::to_string(device) + " peak_allocated") + ':' +
             std::to_string(a.peak_allocated.bytes) + ',' +
             json_string("cuda:" + std::to_string(device) + " peak_reserved") + ':' +
             std::to_string(a.peak_reserved.bytes);

    std::optional<Replay> replay;
    replay_to(source, device, a.window.begin == 0 ? kNoEvent : a.window.begin - 1,
              [&replay](const Replay& state) { replay.emplace(state); });
    CounterTracks tracks(writer, pid, device, origin);
    const std::size_t window_events = a.window.end > a.window.begin ? a.window.end - a.window.begin : 0;
    // The start: the state before the window's first event.
    {
      std::uint64_t start_time = origin;
      if (window_events > 0) {
        for (std::size_t b = 0; b < source.block_count(); ++b) {
          if (source.block_begin(b + 1) <= a.window.begin) continue;
          start_time = source.block(b)[a.window.begin - source.block_begin(b)].time_ns;
          break;
        }
      }
      const auto start = counters_of(replay->totals());
      for (int c = 0; c < kCounters; ++c) tracks.sample(c, start_time, start[c]);
    }
    Bucket bucket;
    std::size_t bucket_index = 0;
    auto flush = [&] {
      if (!bucket.any) return;
      for (int c = 0; c < kCounters; ++c) {
        tracks.sample(c, bucket.max_time[c], bucket.max[c]);
        tracks.sample(c, bucket.last_time[c], bucket.last[c]);
      }
      bucket = Bucket{};
    };
    struct Open {
      snapshot::StringId name;
      std::uint64_t begin;
    };
    std::vector<Open> open;
    std::uint64_t last_time = 0;
    auto slice = [&](snapshot::StringId name, std::uint64_t begin, std::uint64_t end) {
      const std::string text = name.value < snapshot.strings.size() ? snapshot.strings[name.value] : std::string("?");
      writer.event("\"ph\":\"X\",\"name\":" + json_string(text) + ",\"cat\":\"annotation\",\"pid\":" +
                   std::to_string(pid) + ",\"tid\":" + std::to_string(kAnnotationTid) + ",\"ts\":" + micros(begin) +
                   ",\"dur\":" + micros(end > begin ? end - begin : 0));
    };
    // A trace begun mid-run draws memory from the ring's first memory event
    // (Analysis::ring_begins_at), and the older annotations before it too.
    const std::size_t walk_begin = a.window_cut_to_ring ? std::min(options.window.begin, a.window.begin) : a.window.begin;
    for (std::size_t b = 0; b < source.block_count() && source.block_begin(b) < a.window.end; ++b) {
      const std::size_t base = source.block_begin(b);
      if (source.block_begin(b + 1) <= walk_begin) continue;
      const std::span<const snapshot::Event> events = source.block(b);
      const std::size_t from = walk_begin > base ? walk_begin - base : 0;
      const std::size_t to = std::min(events.size(), a.window.end - base);
      for (std::size_t j = from; j < to; ++j) {
        const snapshot::Event& e = events[j];
        const std::uint64_t t = e.time_ns > origin ? e.time_ns - origin : 0;
        last_time = std::max(last_time, t);
        if (first_device && e.kind == EventKind::annotation_begin) {
          open.push_back({snapshot::StringId{static_cast<std::uint32_t>(e.aux)}, t});
        } else if (first_device && e.kind == EventKind::annotation_end) {
          const snapshot::StringId name{static_cast<std::uint32_t>(e.aux)};
          auto it = std::find_if(open.rbegin(), open.rend(), [&](const Open& o) { return o.name == name; });
          if (it != open.rend()) {
            slice(name, it->begin, t);
            open.erase(std::next(it).base());
          } else {
            slice(name, 0, t);  // begun before the trace
          }
        }
        if (e.device != device || base + j < a.window.begin) continue;
        if (const char* name = instant_name(e.kind)) {
          writer.event("\"ph\":\"i\",\"s\":\"t\",\"name\":\"" + std::string(name) + "\",\"pid\":" +
                       std::to_string(pid) + ",\"tid\":" + std::to_string(events_tid(device)) + ",\"ts\":" +
                       micros(t) + ",\"args\":{" + instant_args(e) + "}");
        }
        replay->apply(e);
        const auto now = counters_of(replay->totals());
        if (buckets == 0) {
          for (int c = 0; c < kCounters; ++c) tracks.sample(c, e.time_ns, now[c]);
          continue;
        }
        const std::size_t index = (base + j - a.window.begin) * buckets / std::max<std::size_t>(window_events, 1);
        if (index != bucket_index) flush(), bucket_index = index;
        for (int c = 0; c < kCounters; ++c) {
          if (!bucket.any || now[c] > bucket.max[c]) bucket.max[c] = now[c], bucket.max_time[c] = e.time_ns;
          bucket.last[c] = now[c];
          bucket.last_time[c] = e.time_ns;
        }
        bucket.any = true;
      }
    }
    flush();
    // Phases still open at the end close with the trace.
    for (const Open& o : open) slice(o.name, o.begin, last_time);
    first_device = false;
  }
  writer.finish(other);
}

}  // namespace cachealloc::analyzer
