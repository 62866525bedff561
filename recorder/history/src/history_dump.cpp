// Building a snapshot from the recorder's ring, stacks and the allocator.
// Runs at dump time only: symbolizing and every allocation live here.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>

#include "cachealloc/config.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/text.hpp"
#include "history_state.hpp"
#include "stack_symbols.hpp"
#include "dump_parts.hpp"

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
      frame.ip = symbol.interpreter ? 0 : ip;
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

using State = HistoryRecorder::State;

// A chunk of RingCopy::words.
struct RawChunk {
  std::size_t offset;
  std::uint32_t used;
  std::uint64_t base;
  std::uint32_t thread;
};

// The ring's records, copied raw under the locks (a memcpy per chunk) and
// decoded after them, with what the ring knew at that moment.
struct RingCopy {
  std::vector<RawChunk> chunks;
  std::vector<std::uint64_t> words;
  std::size_t held = 0;             // events in the copied chunks
  std::uint64_t total = 0;          // events recorded since start()
  std::uint64_t newest_dropped = 0;
  std::uint64_t max_entries = 0;
  detail::TickAnchor anchor;
};

// What the cut reads besides the layout. The driver and NVML are read
// inside it too, so their figures describe the same moment as reserved (no
// allocator call can run).
struct CutReadings {
  std::map<std::string, std::int64_t> stats;
  std::optional<MemoryInfo> memory;  // none from a device that cannot report it
  DeviceUsage usage_at_dump;
  std::vector<State::OomUsage> oom_usage;
  RingCopy ring;
};

// Needs every shard lock (no thread is filling its staging chunk); takes ring_lock.
RingCopy copy_ring(State& s) {
  RingCopy copy;
  std::lock_guard lock(s.ring_lock);
  auto take = [&](const Chunk* chunk) {
    if (!chunk || chunk->empty()) return;
    copy.chunks.push_back(RawChunk{copy.words.size(), chunk->used, chunk->base_ticks, chunk->thread});
    copy.words.insert(copy.words.end(), chunk->words, chunk->words + chunk->used);
    copy.held += chunk->count.load(std::memory_order_relaxed);
  };
  std::size_t words = 0;
  for (const Chunk* chunk : s.ring) words += chunk->used;
  for (const auto& slot : s.slots) words += slot->staging.used;
  copy.words.reserve(words + s.annotation_slot->staging.used);
  for (const Chunk* chunk : s.ring) take(chunk);
  for (const auto& slot : s.slots) take(&slot->staging);
  take(&s.annotation_slot->staging);
  copy.total = s.evicted + copy.held;
  copy.newest_dropped = s.newest_dropped;
  copy.max_entries = s.max_entries;
  copy.anchor = s.anchor;
  return copy;
}

// Runs inside layout()'s callback, where every shard lock is held.
CutReadings read_in_cut(State& s) {
  CutReadings cut;
  cut.stats = s.allocator.stats().to_map();
  Device& device = s.allocator.device();
  try {
    cut.memory = device.memory_info();
  } catch (const std::exception&) {
    // A device that cannot report memory still gets its history dumped.
  }
  cut.usage_at_dump = device.usage();
  {
    std::lock_guard usage_lock(s.usage_mutex);
    cut.oom_usage = s.oom_usage;
  }
  cut.ring = copy_ring(s);
  return cut;
}

// The ring holds at least max_entries events, and often more (records are
// smaller than the worst case it is sized for). When it holds more, only
// the newest max_entries are decoded: the time of the max_entries-th
// newest bounds them (with its ties, which keep_unbroken_newest settles).
std::uint64_t oldest_ticks_to_decode(const RingCopy& ring) {
  if (ring.held <= ring.max_entries) return 0;
  std::vector<std::uint64_t> times;
  times.reserve(ring.held);
  for (const RawChunk& chunk : ring.chunks)
    detail::record_times(ring.words.data() + chunk.offset, chunk.used, chunk.base, times);
  const auto nth = times.end() - static_cast<std::ptrdiff_t>(ring.max_entries);
  std::nth_element(times.begin(), nth, times.end());
  return *nth;
}

// The events of the copy, times still in ticks, in time order chunk by chunk only.
std::vector<snapshot::Event> decode_newest(const RingCopy& ring, std::int32_t device) {
  const std::uint64_t from_ticks = oldest_ticks_to_decode(ring);
  std::vector<snapshot::Event> events;
  events.reserve(std::min<std::size_t>(ring.held, ring.max_entries + Chunk::kWords));
  for (const RawChunk& chunk : ring.chunks)
    detail::decode_records(ring.words.data() + chunk.offset, chunk.used, chunk.base, device, chunk.thread, events,
                           from_ticks);
  return events;
}

// Chunks come from different threads, so the events are in time order
// only chunk by chunk. Sort (stable: a thread's events keep their order),
// drop what is older than an event the ring let go, so that the trace is
// one unbroken stretch of time, and keep the newest max_entries. (Events
// of one allocator call share a time; those of an evicted event's own call
// that are still here came after it, and stay.)
void keep_unbroken_newest(std::vector<snapshot::Event>& events, const RingCopy& ring) {
  std::stable_sort(events.begin(), events.end(),
                   [](const snapshot::Event& a, const snapshot::Event& b) { return a.time_ns < b.time_ns; });
  if (ring.total > events.size()) {
    const auto older = std::lower_bound(events.begin(), events.end(), ring.newest_dropped,
                                        [](const snapshot::Event& e, std::uint64_t t) { return e.time_ns < t; });
    events.erase(events.begin(), older);
  }
  if (events.size() > ring.max_entries)
    events.erase(events.begin(), events.begin() + static_cast<std::ptrdiff_t>(events.size() - ring.max_entries));
}

// Each OOM's NVML reading, with the index of its event, while times are
// still ticks; a reading whose OOM the ring let go goes with it.
std::vector<snapshot::DeviceUsage> pair_oom_usage(const std::vector<State::OomUsage>& readings,
                                                  const std::vector<snapshot::Event>& events) {
  std::vector<snapshot::DeviceUsage> usage;
  for (const State::OomUsage& reading : readings) {
    if (reading.usage.source == DeviceUsage::Source::unavailable) continue;
    auto it = std::lower_bound(events.begin(), events.end(), reading.ticks,
                               [](const snapshot::Event& e, std::uint64_t t) { return e.time_ns < t; });
    for (; it != events.end() && it->time_ns == reading.ticks; ++it) {
      if (it->kind != snapshot::EventKind::oom || it->thread != reading.thread) continue;
      snapshot::DeviceUsage u = detail::usage_reading(reading.usage);
      u.event = static_cast<std::uint64_t>(it - events.begin());
      usage.push_back(u);
      break;
    }
  }
  std::sort(usage.begin(), usage.end(),
            [](const snapshot::DeviceUsage& a, const snapshot::DeviceUsage& b) { return a.event < b.event; });
  return usage;
}

// Ticks to CLOCK_MONOTONIC ns, by the line through the anchors of start()
// and of the dump (clock.hpp).
void convert_ticks_to_ns(std::vector<snapshot::Event>& events, const detail::TickAnchor& start,
                         const detail::TickAnchor& dump) {
  const long double tick_ns =
      dump.ticks > start.ticks
          ? static_cast<long double>(dump.ns - start.ns) / static_cast<long double>(dump.ticks - start.ticks)
          : 1.0L;
  for (auto& event : events) {
    const auto delta = static_cast<long double>(static_cast<std::int64_t>(event.time_ns - start.ticks));
    event.time_ns = start.ns + static_cast<std::uint64_t>(static_cast<std::int64_t>(delta * tick_ns));
  }
}

// `oom_usage`: the readings at OOMs, their times in ns; the reading at the
// dump goes after them.
snapshot::DeviceInfo describe_device(const Device& device, const CutReadings& cut,
                                     std::vector<snapshot::DeviceUsage> oom_usage, std::uint64_t dump_ns) {
  snapshot::DeviceInfo info;
  info.index = device.index();
  info.name = device.name();
  if (cut.memory) {
    info.total_bytes = cut.memory->total;
    info.driver_free_at_dump = cut.memory->free;
    info.driver_total_at_dump = cut.memory->total;
  }
  const DeviceUsage& at_dump = cut.usage_at_dump;
  info.usage_note = at_dump.note;
  switch (at_dump.source) {
    case DeviceUsage::Source::nvml: info.usage_source = snapshot::UsageSource::nvml; break;
    case DeviceUsage::Source::simulated: info.usage_source = snapshot::UsageSource::simulated; break;
    case DeviceUsage::Source::unavailable: info.usage_source = snapshot::UsageSource::unavailable; break;
  }
  if (at_dump.source != DeviceUsage::Source::unavailable) {
    info.usage = std::move(oom_usage);
    snapshot::DeviceUsage reading = detail::usage_reading(at_dump);
    reading.time_ns = dump_ns;
    info.usage.push_back(reading);
  }
  return info;
}

void add_settings(std::map<std::string, std::string>& settings, const AllocatorConfig& config,
                  const Device& device, const HistoryOptions& options) {
  const std::string canonical = to_string(config);
  add_config_pairs(canonical, settings);
  settings["config"] = config.source.empty() ? canonical : config.source;
  settings["device.backend"] = device.backend();
  settings["history.max_entries"] = std::to_string(options.max_entries);
  settings["history.stacks"] = to_string(options.stacks);
  settings["history.max_frames"] = std::to_string(options.max_frames);
  settings["history.stacks_on_free"] = options.stacks_on_free ? "true" : "false";
  settings["history.clock"] = to_string(options.clock);
  if (options.clock == HistoryClock::coarse) {
    timespec resolution{};
    if (clock_getres(CLOCK_MONOTONIC_COARSE, &resolution) == 0)
      settings["history.clock_resolution_ns"] =
          std::to_string(static_cast<std::uint64_t>(resolution.tv_sec) * 1'000'000'000u +
                         static_cast<std::uint64_t>(resolution.tv_nsec));
  }
}

std::vector<std::string> copy_annotation_names(State& s) {
  std::lock_guard lock(s.strings_mutex);
  return {s.strings.begin(), s.strings.end()};
}

// The recorder's stack ids that the events and the segments refer to: only
// those are symbolized.
std::unordered_map<std::uint32_t, bool> referenced_stacks(const snapshot::Snapshot& out) {
  std::unordered_map<std::uint32_t, bool> referenced;
  for (const auto& event : out.events)
    if (event.stack) referenced[event.stack.value] = true;
  for (const auto& segment : out.segments) {
    if (segment.stack) referenced[segment.stack.value] = true;
    for (const auto& block : segment.blocks)
      if (block.stack) referenced[block.stack.value] = true;
  }
  return referenced;
}

// Fills the string, frame and stack tables (the annotation names first, so
// that their ids hold) and gives the events and segments the snapshot's
// stack ids. Returns the frames the symbolizer failed on.
std::uint64_t symbolize_stacks(snapshot::Snapshot& out, std::vector<std::string> annotation_names,
                               const detail::StackTable& table) {
  const std::unordered_map<std::uint32_t, bool> referenced = referenced_stacks(out);
  TableBuilder tables(out, std::move(annotation_names));
  tables.add_stacks(table.entries(), referenced);
  for (auto& event : out.events) event.stack = tables.map(event.stack);
  for (auto& segment : out.segments) {
    segment.stack = tables.map(segment.stack);
    for (auto& block : segment.blocks) block.stack = tables.map(block.stack);
  }
  return tables.symbolization_failures();
}

}  // namespace

snapshot::DeviceUsage detail::usage_reading(const DeviceUsage& reading) {
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

// The cut. The layout, the stats and the ring must describe the same moment,
// or a replay of the events will not end in the layout. Every allocator event
// is appended, and every stats change made, under a shard lock; layout() runs
// our callback while it holds all of them, so what we read there is exact.
snapshot::Snapshot HistoryRecorder::take_snapshot() const {
  State& s = *state_;
  snapshot::Snapshot out;
  out.header = make_header();
  CutReadings cut;
  std::vector<snapshot::Segment> layout = s.allocator.layout([&] { cut = read_in_cut(s); });

  std::vector<snapshot::Event> events = decode_newest(cut.ring, s.device);
  std::vector<std::uint64_t>().swap(cut.ring.words);
  const detail::TickAnchor dump_anchor = detail::TickAnchor::now(s.tick_source());
  keep_unbroken_newest(events, cut.ring);
  out.dropped_events = cut.ring.total - events.size();
  out.events = std::move(events);

  // Paired before the conversion: a reading is keyed to its OOM by ticks.
  std::vector<snapshot::DeviceUsage> oom_usage = pair_oom_usage(cut.oom_usage, out.events);
  convert_ticks_to_ns(out.events, cut.ring.anchor, dump_anchor);
  for (snapshot::DeviceUsage& u : oom_usage) u.time_ns = out.events[u.event].time_ns;
  out.devices.push_back(describe_device(s.allocator.device(), cut, std::move(oom_usage), dump_anchor.ns));

  add_settings(out.settings, s.allocator.config(), s.allocator.device(), options());
  out.stats = std::move(cut.stats);

  out.segments = std::move(layout);
  const std::uint64_t symbolization_failures = symbolize_stacks(out, copy_annotation_names(s), s.table);
  out.threads = detail::registered_threads();
  make_text_valid(out);
  s.symbolization_failures.store(symbolization_failures, std::memory_order_relaxed);
  return out;
}

snapshot::Header detail::history_header() { return make_header(); }

void detail::history_settings(std::map<std::string, std::string>& settings, const AllocatorConfig& config,
                              const Device& device, const HistoryOptions& options) {
  add_settings(settings, config, device, options);
}

void detail::make_history_text_valid(snapshot::Snapshot& snapshot) { make_text_valid(snapshot); }

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
