// Building a snapshot from the recorder's ring, stacks and the allocator.
// Runs at dump time only: symbolizing and every allocation live here.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>

#include "cachealloc/config.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/text.hpp"
#include "history_state.hpp"
#include "stack_symbols.hpp"

#ifndef CACHEALLOC_VERSION
#define CACHEALLOC_VERSION "unknown"
#endif

namespace cachealloc {

namespace {


std::vector<std::string> command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start < all.size()) {
    const std::size_t end = all.find('\0', start);
    parts.push_back(all.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

snapshot::Header make_header() {
  snapshot::Header header;
  header.writer_version = CACHEALLOC_VERSION;
  header.source = "cachealloc";
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  header.dump_time_unix_ns =
      static_cast<std::uint64_t>(now.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(now.tv_nsec);
  std::vector<std::string> cmdline = command_line();
  if (!cmdline.empty()) {
    header.program = cmdline.front();
    header.arguments.assign(cmdline.begin() + 1, cmdline.end());
  }
  header.pid = static_cast<std::int64_t>(::getpid());
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) header.host = host;
  return header;
}

// Readers refuse text that is not UTF-8 (snapshot/invariants.hpp), and a
// symbol, a path or an argument can hold any bytes: each invalid byte
// becomes U+FFFD here, so the dump is always readable.
void make_text_valid(snapshot::Snapshot& out) {
  auto fix = [](std::string& text) {
    if (snapshot::invalid_utf8_bytes(text) != 0) text = snapshot::to_valid_utf8(text);
  };
  for (std::string& text : out.strings) fix(text);
  fix(out.header.program);
  fix(out.header.host);
  for (std::string& argument : out.header.arguments) fix(argument);
  for (snapshot::DeviceInfo& device : out.devices) {
    fix(device.name);
    fix(device.usage_note);
  }
  std::map<std::string, std::string> settings;
  for (auto& [key, value] : out.settings) {
    std::string k = key;
    fix(k);
    fix(value);
    settings[k] = value;
  }
  out.settings = std::move(settings);
}

// "k:v,k:[a,b],k2:v2" -> {k: v, ...}; commas inside brackets stay.
void add_config_pairs(const std::string& text, std::map<std::string, std::string>& out) {
  int depth = 0;
  std::string item;
  auto flush = [&] {
    const std::size_t colon = item.find(':');
    if (colon != std::string::npos) out[item.substr(0, colon)] = item.substr(colon + 1);
    item.clear();
  };
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0)
      flush();
    else
      item += c;
  }
  flush();
}

// Dense snapshot ids for the recorder's shard-encoded stack ids, and the
// frame and string tables, each unique frame symbolized once.
class TableBuilder {
 public:
  TableBuilder(snapshot::Snapshot& out, std::vector<std::string> annotation_strings) : out_(out) {
    out_.strings = std::move(annotation_strings);
    for (std::uint32_t i = 0; i < out_.strings.size(); ++i) string_ids_.emplace(out_.strings[i], i);
  }
  void add_stacks(const std::vector<detail::StackTable::Entry>& entries,
                  const std::unordered_map<std::uint32_t, bool>& referenced) {
    for (const auto& entry : entries) {
      if (!referenced.count(entry.id)) continue;
      snapshot::Stack stack;
      for (std::uintptr_t ip : entry.frames) stack.frames.push_back(frame_id(ip));
      stack_ids_[entry.id] = static_cast<std::uint32_t>(out_.stacks.size());
      out_.stacks.push_back(std::move(stack));
    }
  }
  snapshot::StackId map(snapshot::StackId internal) const {
    auto it = stack_ids_.find(internal.value);
    return snapshot::StackId{it == stack_ids_.end() ? 0u : it->second};
  }

 private:
  snapshot::StringId string_id(const std::string& text) {
    if (text.empty()) return {};
    auto [it, inserted] = string_ids_.try_emplace(text, static_cast<std::uint32_t>(out_.strings.size()));
    if (inserted) out_.strings.push_back(text);
    return snapshot::StringId{it->second};
  }
  snapshot::FrameId frame_id(std::uintptr_t ip) {
    auto [it, inserted] = frame_ids_.try_emplace(ip, static_cast<std::uint32_t>(out_.frames.size()));
    if (inserted) {
      const detail::SymbolizedFrame symbol = detail::symbolize(ip);
      symbolization_failures_ += symbol.failed ? 1 : 0;
      snapshot::Frame frame;
      frame.ip = ip;
      frame.function = string_id(symbol.function);
      frame.file = string_id(symbol.file);
      frame.line = symbol.line;
      frame.module = string_id(symbol.module);
      out_.frames.push_back(frame);
    }
    return snapshot::FrameId{it->second};
  }

  snapshot::Snapshot& out_;
  std::unordered_map<std::string, std::uint32_t> string_ids_;
  std::unordered_map<std::uintptr_t, std::uint32_t> frame_ids_;

 public:
  std::uint64_t symbolization_failures() const noexcept { return symbolization_failures_; }

 private:
  std::uint64_t symbolization_failures_ = 0;
  std::unordered_map<std::uint32_t, std::uint32_t> stack_ids_;
};

snapshot::DeviceUsage to_snapshot(const DeviceUsage& reading) {
  snapshot::DeviceUsage u;
  u.process_found = reading.process_found;
  u.process_used = reading.process_used;
  u.device_used = reading.device_used;
  u.device_reserved = reading.device_reserved;
  u.device_total = reading.device_total;
  u.other_processes = reading.other_processes;
  u.other_processes_used = reading.other_processes_used;
  return u;
}

}  // namespace

// The cut. The layout, the stats and the ring must describe the same moment,
// or a replay of the events will not end in the layout. Every allocator event
// is appended, and every stats change made, under a pool lock; layout() runs
// our callback while it holds all of them, so what we read there is exact.
snapshot::Snapshot HistoryRecorder::take_snapshot() const {
  State& s = *state_;
  snapshot::Snapshot out;
  out.header = make_header();

  std::map<std::string, std::int64_t> stats;
  std::uint64_t total = 0;  // events recorded since start()
  std::uint64_t newest_dropped = 0;
  std::uint64_t max_entries = 0;
  detail::TickAnchor anchor;
  std::vector<snapshot::Event> events;
  struct RawChunk {
    std::size_t offset;
    std::uint32_t used;
    std::uint64_t base;
    std::uint32_t thread;
  };
  std::vector<RawChunk> raw;
  std::vector<std::uint64_t> raw_words;
  std::size_t held = 0;
  Device& device = s.allocator.device();
  // The driver and NVML are read inside the cut too, so their figures
  // describe the same moment as reserved (no allocator call can run).
  MemoryInfo memory;
  bool memory_known = false;
  DeviceUsage usage_at_dump;
  std::vector<State::OomUsage> oom_usage;
  std::vector<snapshot::Segment> layout = s.allocator.layout([&] {
    stats = s.allocator.stats().to_map();
    try {
      memory = device.memory_info();
      memory_known = true;
    } catch (const std::exception&) {
      // A device that cannot report memory still gets its history dumped.
    }
    usage_at_dump = device.usage();
    {
      std::lock_guard usage_lock(s.usage_mutex);
      oom_usage = s.oom_usage;
    }
    // Copied raw under the locks (a memcpy per chunk), decoded after them.
    std::lock_guard lock(s.ring_lock);
    auto take = [&](const Chunk* chunk) {
      if (!chunk || chunk->empty()) return;
      raw.push_back(RawChunk{raw_words.size(), chunk->used, chunk->base_ticks, chunk->thread});
      raw_words.insert(raw_words.end(), chunk->words, chunk->words + chunk->used);
      held += chunk->count.load(std::memory_order_relaxed);
    };
    std::size_t words = 0;
    for (const Chunk* chunk : s.ring) words += chunk->used;
    for (const auto& slot : s.slots) words += slot->staging.used;
    raw_words.reserve(words + s.annotation_slot->staging.used);
    for (const Chunk* chunk : s.ring) take(chunk);
    for (const auto& slot : s.slots) take(&slot->staging);
    take(&s.annotation_slot->staging);
    total = s.evicted + held;
    newest_dropped = s.newest_dropped;
    max_entries = s.max_entries;
    anchor = s.anchor;
  });
  // The ring holds at least max_entries events, and often more (records are
  // smaller than the worst case it is sized for). When it holds more, only
  // the newest max_entries are decoded: the time of the max_entries-th
  // newest bounds them (with its ties, which the trim below settles).
  std::uint64_t from_ticks = 0;
  if (held > max_entries) {
    std::vector<std::uint64_t> times;
    times.reserve(held);
    for (const RawChunk& chunk : raw) detail::record_times(raw_words.data() + chunk.offset, chunk.used, chunk.base, times);
    const auto nth = times.end() - static_cast<std::ptrdiff_t>(max_entries);
    std::nth_element(times.begin(), nth, times.end());
    from_ticks = *nth;
  }
  events.reserve(std::min<std::size_t>(held, max_entries + Chunk::kWords));
  for (const RawChunk& chunk : raw)
    detail::decode_records(raw_words.data() + chunk.offset, chunk.used, chunk.base, s.device, chunk.thread, events,
                           from_ticks);
  std::vector<std::uint64_t>().swap(raw_words);
  const detail::TickAnchor dump_anchor = detail::TickAnchor::now(s.tick_source());
  // Chunks come from different threads, so the events are in time order
  // only chunk by chunk. Sort (stable: a thread's events keep their order),
  // drop what is older than an event the ring let go, so that the trace is
  // one unbroken stretch of time, and keep the newest max_entries. (Events
  // of one allocator call share a time; those of an evicted event's own call
  // that are still here came after it, and stay.)
  std::stable_sort(events.begin(), events.end(),
                   [](const snapshot::Event& a, const snapshot::Event& b) { return a.time_ns < b.time_ns; });
  if (total > events.size()) {
    const auto older = std::lower_bound(events.begin(), events.end(), newest_dropped,
                                        [](const snapshot::Event& e, std::uint64_t t) { return e.time_ns < t; });
    events.erase(events.begin(), older);
  }
  if (events.size() > max_entries)
    events.erase(events.begin(), events.begin() + static_cast<std::ptrdiff_t>(events.size() - max_entries));
  out.dropped_events = total - events.size();
  out.events = std::move(events);

  // Pair each OOM's NVML reading with its event while times are still
  // ticks; a reading whose OOM the ring let go goes with it.
  std::vector<snapshot::DeviceUsage> usage;
  for (const State::OomUsage& reading : oom_usage) {
    if (reading.usage.source == DeviceUsage::Source::unavailable) continue;
    auto it = std::lower_bound(out.events.begin(), out.events.end(), reading.ticks,
                               [](const snapshot::Event& e, std::uint64_t t) { return e.time_ns < t; });
    for (; it != out.events.end() && it->time_ns == reading.ticks; ++it) {
      if (it->kind != snapshot::EventKind::oom || it->thread != reading.thread) continue;
      snapshot::DeviceUsage u = to_snapshot(reading.usage);
      u.event = static_cast<std::uint64_t>(it - out.events.begin());
      usage.push_back(u);
      break;
    }
  }
  std::sort(usage.begin(), usage.end(),
            [](const snapshot::DeviceUsage& a, const snapshot::DeviceUsage& b) { return a.event < b.event; });

  // Ticks to CLOCK_MONOTONIC ns (history_state.hpp).
  const long double tick_ns =
      dump_anchor.ticks > anchor.ticks
          ? static_cast<long double>(dump_anchor.ns - anchor.ns) / static_cast<long double>(dump_anchor.ticks - anchor.ticks)
          : 1.0L;
  for (auto& event : out.events) {
    const auto delta = static_cast<long double>(static_cast<std::int64_t>(event.time_ns - anchor.ticks));
    event.time_ns = anchor.ns + static_cast<std::uint64_t>(static_cast<std::int64_t>(delta * tick_ns));
  }

  for (snapshot::DeviceUsage& u : usage) u.time_ns = out.events[u.event].time_ns;
  snapshot::DeviceInfo info;
  info.index = device.index();
  info.name = device.name();
  if (memory_known) {
    info.total_bytes = memory.total;
    info.driver_free_at_dump = memory.free;
    info.driver_total_at_dump = memory.total;
  }
  info.usage_note = usage_at_dump.note;
  switch (usage_at_dump.source) {
    case DeviceUsage::Source::nvml: info.usage_source = snapshot::UsageSource::nvml; break;
    case DeviceUsage::Source::simulated: info.usage_source = snapshot::UsageSource::simulated; break;
    case DeviceUsage::Source::unavailable: info.usage_source = snapshot::UsageSource::unavailable; break;
  }
  if (usage_at_dump.source != DeviceUsage::Source::unavailable) {
    info.usage = std::move(usage);
    snapshot::DeviceUsage at_dump = to_snapshot(usage_at_dump);
    at_dump.time_ns = dump_anchor.ns;
    info.usage.push_back(at_dump);
  }
  out.devices.push_back(info);

  const AllocatorConfig& config = s.allocator.config();
  const std::string canonical = to_string(config);
  add_config_pairs(canonical, out.settings);
  out.settings["config"] = config.source.empty() ? canonical : config.source;
  out.settings["device.backend"] = device.backend();
  {
    const HistoryOptions options = this->options();
    out.settings["history.max_entries"] = std::to_string(options.max_entries);
    out.settings["history.stacks"] = to_string(options.stacks);
    out.settings["history.max_frames"] = std::to_string(options.max_frames);
    out.settings["history.stacks_on_free"] = options.stacks_on_free ? "true" : "false";
    out.settings["history.clock"] = to_string(options.clock);
    if (options.clock == HistoryClock::coarse) {
      timespec resolution{};
      if (clock_getres(CLOCK_MONOTONIC_COARSE, &resolution) == 0)
        out.settings["history.clock_resolution_ns"] =
            std::to_string(static_cast<std::uint64_t>(resolution.tv_sec) * 1'000'000'000u +
                           static_cast<std::uint64_t>(resolution.tv_nsec));
    }
  }
  out.stats = std::move(stats);

  std::vector<std::string> annotation_strings;
  {
    std::lock_guard lock(s.strings_mutex);
    annotation_strings = s.strings;
  }
  std::unordered_map<std::uint32_t, bool> referenced;
  for (const auto& event : out.events)
    if (event.stack) referenced[event.stack.value] = true;
  for (const auto& segment : layout) {
    if (segment.stack) referenced[segment.stack.value] = true;
    for (const auto& block : segment.blocks)
      if (block.stack) referenced[block.stack.value] = true;
  }
  TableBuilder tables(out, std::move(annotation_strings));
  tables.add_stacks(s.table.entries(), referenced);
  for (auto& event : out.events) event.stack = tables.map(event.stack);
  for (auto& segment : layout) {
    segment.stack = tables.map(segment.stack);
    for (auto& block : segment.blocks) block.stack = tables.map(block.stack);
  }
  out.segments = std::move(layout);
  out.threads = detail::registered_threads();
  make_text_valid(out);
  s.symbolization_failures.store(tables.symbolization_failures(), std::memory_order_relaxed);
  return out;
}

bool HistoryRecorder::dump_snapshot(const std::filesystem::path& path) noexcept {
  try {
    snapshot::write_snapshot(take_snapshot(), path);
    // The file is written (failed frames are bare addresses in it), but a
    // symbolizer that throws will throw again: recording stops here.
    if (const std::uint64_t failed = state_->symbolization_failures.load(std::memory_order_relaxed); failed != 0) {
      std::fprintf(stderr,
                   "cachealloc: the symbolizer failed on %llu frames of the memory snapshot %s (written with bare "
                   "addresses for them); deactivating history recording\n",
                   static_cast<unsigned long long>(failed), path.c_str());
      stop();
      return false;
    }
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cachealloc: cannot dump the memory snapshot to %s: %s; deactivating history recording\n",
                 path.c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "cachealloc: cannot dump the memory snapshot to %s; deactivating history recording\n",
                 path.c_str());
  }
  stop();
  return false;
}

}  // namespace cachealloc
