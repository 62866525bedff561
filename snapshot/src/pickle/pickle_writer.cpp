// The pickle writer: a Snapshot as `_dump_snapshot` would have written it.
// Protocol 4, only opcodes that our reader accepts, strings, frames and
// stacks memoized so each is written once (PyTorch's own dumps share them the
// same way).
#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "cachealloc/snapshot/pickle.hpp"
#include "pickle_block_sizes.hpp"
#include "pickle_file.hpp"
#include "pickle_value.hpp"

namespace cachealloc::snapshot {

namespace {

// The pickler batches APPENDS and SETITEMS like Python's, so a reader's
// stack never holds more than this many items per container.
constexpr std::size_t kBatch = 1000;
constexpr std::int32_t kMaxDevices = 4096;

class PickleWriter {
 public:
  std::vector<std::byte> bytes;

  void op(std::uint8_t code) { bytes.push_back(std::byte{code}); }
  void le(std::uint64_t value, int width) {
    for (int i = 0; i < width; ++i) bytes.push_back(std::byte{static_cast<std::uint8_t>(value >> (8 * i))});
  }

  void integer(std::int64_t value) {
    if (value >= 0 && value < 256) {
      op(0x4b);  // BININT1
      le(static_cast<std::uint64_t>(value), 1);
    } else if (value >= 0 && value < 65536) {
      op(0x4d);  // BININT2
      le(static_cast<std::uint64_t>(value), 2);
    } else if (value >= INT32_MIN && value <= INT32_MAX) {
      op(0x4a);  // BININT
      le(static_cast<std::uint64_t>(value), 4);
    } else {
      long1(static_cast<std::uint64_t>(value), value < 0);
    }
  }
  void unsigned_integer(std::uint64_t value) {
    if (value <= static_cast<std::uint64_t>(INT64_MAX)) integer(static_cast<std::int64_t>(value));
    else long1(value, false);  // 2^63 and above: 9 bytes with a 0x00 sign byte
  }
  // LONG1: minimal little-endian two's complement.
  void long1(std::uint64_t bits, bool negative) {
    std::vector<std::uint8_t> raw;
    for (int i = 0; i < 8; ++i) raw.push_back(static_cast<std::uint8_t>(bits >> (8 * i)));
    const std::uint8_t extension = negative ? 0xff : 0x00;
    if (!negative && (raw.back() & 0x80u) != 0) raw.push_back(0x00);
    while (raw.size() > 1 && raw.back() == extension &&
           ((raw[raw.size() - 2] & 0x80u) != 0) == negative) {
      raw.pop_back();
    }
    op(0x8a);
    le(raw.size(), 1);
    for (const std::uint8_t b : raw) bytes.push_back(std::byte{b});
  }
  void boolean(bool value) { op(value ? 0x88 : 0x89); }
  void none() { op(0x4e); }
  void floating(double value) {
    std::uint64_t bits = 0;
    static_assert(sizeof bits == sizeof value);
    std::memcpy(&bits, &value, sizeof bits);
    op(0x47);  // BINFLOAT, big-endian
    for (int i = 7; i >= 0; --i) bytes.push_back(std::byte{static_cast<std::uint8_t>(bits >> (8 * i))});
  }

  // Every string is written once and fetched from the memo afterwards.
  void text(std::string_view value) {
    const auto found = memoized_text_.find(std::string(value));
    if (found != memoized_text_.end()) {
      get(found->second);
      return;
    }
    if (value.size() < 256) {
      op(0x8c);  // SHORT_BINUNICODE
      le(value.size(), 1);
    } else if (value.size() <= UINT32_MAX) {
      op(0x58);  // BINUNICODE
      le(value.size(), 4);
    } else {
      op(0x8d);  // BINUNICODE8
      le(value.size(), 8);
    }
    const auto* data = reinterpret_cast<const std::byte*>(value.data());
    bytes.insert(bytes.end(), data, data + value.size());
    memoized_text_.emplace(std::string(value), memoize());
  }

  std::uint32_t memoize() {
    op(0x94);
    return memo_size_++;
  }
  void get(std::uint32_t index) {
    if (index < 256) {
      op(0x68);  // BINGET
      le(index, 1);
    } else {
      op(0x6a);  // LONG_BINGET
      le(index, 4);
    }
  }

  // A dict built as Python's pickler does: EMPTY_DICT, MEMOIZE, then
  // MARK key value ... SETITEMS in batches. `fill` writes the pairs and
  // returns how many it wrote; the batching is the caller's (dicts here are small).
  template <class Fill>
  void dict(Fill&& fill) {
    op(0x7d);
    memoize();
    op(0x28);
    fill();
    op(0x75);
  }
  // A list whose items `write_item(i)` writes, for i in [0, count).
  template <class WriteItem>
  std::uint32_t list(std::size_t count, WriteItem&& write_item) {
    op(0x5d);
    const std::uint32_t index = memoize();
    for (std::size_t start = 0; start < count; start += kBatch) {
      op(0x28);
      for (std::size_t i = start; i < count && i < start + kBatch; ++i) write_item(i);
      op(0x65);
    }
    return index;
  }

 private:
  std::unordered_map<std::string, std::uint32_t> memoized_text_;
  std::uint32_t memo_size_ = 0;
};

class SnapshotPickler {
 public:
  explicit SnapshotPickler(const Snapshot& snapshot) : s_(snapshot) {}

  std::vector<std::byte> run() {
    w_.op(0x80);
    w_.le(4, 1);
    w_.dict([&] {
      w_.text("segments");
      write_segments();
      w_.text("device_traces");
      write_traces();
      // A pickle read without allocator_settings is written without them:
      // the reader's own keys alone would make unknown settings known.
      if (!settings_unknown()) {
        w_.text("allocator_settings");
        write_settings();
      }
      w_.text("external_annotations");
      write_annotations();
    });
    w_.op(0x2e);  // STOP
    return std::move(w_.bytes);
  }

 private:
  const std::string& string(StringId id) const { return s_.strings[id.value]; }

  // The pickle reader's mark of a file that held no allocator_settings.
  bool settings_unknown() const {
    const auto policy = s_.settings.find("block_sizes.policy");
    return policy != s_.settings.end() && policy->second == "defaults (no allocator_settings)";
  }

  void write_frame(FrameId id) {
    const auto found = frame_memo_.find(id.value);
    if (found != frame_memo_.end()) {
      w_.get(found->second);
      return;
    }
    const Frame& frame = s_.frames[id.value];
    w_.op(0x7d);
    frame_memo_.emplace(id.value, w_.memoize());
    w_.op(0x28);
    // The frame's own name and file, empty where it has none: a reader takes
    // them for a symbol and a source file, so an address or a module in
    // their place came back as another frame (and frames that differ only
    // there merged). The ip and the module are losses convert names.
    w_.text("name");
    w_.text(string(frame.function));
    w_.text("filename");
    w_.text(string(frame.file));
    w_.text("line");
    w_.integer(frame.line);
    w_.op(0x75);
  }

  void write_stack(StackId id) {
    if (!id) {
      // A fresh [] per record, as PyTorch writes for no frames, memoized as
      // Python's pickler memoizes every list: the reader takes whole entries
      // of that shape in one step and on several threads, and a bare []
      // sent two thirds of a trace (the frees) through the one-by-one path.
      w_.op(0x5d);
      w_.memoize();
      return;
    }
    const auto found = stack_memo_.find(id.value);
    if (found != stack_memo_.end()) {
      w_.get(found->second);
      return;
    }
    const Stack& stack = s_.stacks[id.value];
    const std::uint32_t index = w_.list(stack.frames.size(), [&](std::size_t i) { write_frame(stack.frames[i]); });
    stack_memo_.emplace(id.value, index);
  }

  static const char* state_name(BlockState state) {
    switch (state) {
      case BlockState::active_allocated: return "active_allocated";
      case BlockState::active_pending_free: return "active_pending_free";
      default: return "inactive";
    }
  }

  // PyTorch reports each mapped run of an expandable segment as a segment of
  // its own and has no unmapped blocks; a segment splits at every unmapped block.
  struct Run {
    const Segment* segment;
    std::size_t first, last;  // blocks [first, last)
  };
  std::vector<Run> mapped_runs() const {
    std::vector<Run> runs;
    for (const Segment& segment : s_.segments) {
      std::size_t start = 0;
      for (std::size_t b = 0; b <= segment.blocks.size(); ++b) {
        if (b == segment.blocks.size() || segment.blocks[b].state == BlockState::unmapped) {
          if (b > start || segment.blocks.empty()) runs.push_back({&segment, start, b});
          start = b + 1;
        }
      }
    }
    return runs;
  }

  void write_segments() {
    const std::vector<Run> runs = mapped_runs();
    w_.list(runs.size(), [&](std::size_t r) {
      const Run& run = runs[r];
      const Segment& segment = *run.segment;
      std::uint64_t total = 0, allocated = 0, active = 0, requested = 0;
      for (std::size_t b = run.first; b < run.last; ++b) {
        const Block& block = segment.blocks[b];
        total += block.size;
        if (block.state == BlockState::active_allocated) allocated += block.size;
        if (block.state != BlockState::inactive) {
          active += block.size;
          requested += block.requested;
        }
      }
      const bool whole = run.first == 0 && run.last == segment.blocks.size();
      if (whole) total = segment.total_size;
      const std::uint64_t address = run.last > run.first ? segment.blocks[run.first].address : segment.address;
      w_.dict([&] {
        w_.text("device");
        w_.integer(segment.device);
        w_.text("address");
        w_.unsigned_integer(whole ? segment.address : address);
        w_.text("total_size");
        w_.unsigned_integer(total);
        w_.text("allocated_size");
        w_.unsigned_integer(allocated);
        w_.text("active_size");
        w_.unsigned_integer(active);
        w_.text("requested_size");
        w_.unsigned_integer(requested);
        w_.text("stream");
        w_.integer(static_cast<std::int64_t>(segment.stream));
        w_.text("segment_type");
        w_.text(segment.large_pool ? "large" : "small");
        w_.text("segment_pool_id");
        w_.integer(0);
        w_.integer(0);
        w_.op(0x86);  // TUPLE2
        w_.text("is_expandable");
        w_.boolean(segment.expandable);
        w_.text("frames");
        write_stack(segment.stack);
        w_.text("blocks");
        w_.list(run.last - run.first, [&](std::size_t i) {
          const Block& block = segment.blocks[run.first + i];
          w_.dict([&] {
            w_.text("address");
            w_.unsigned_integer(block.address);
            w_.text("size");
            w_.unsigned_integer(block.size);
            w_.text("requested_size");
            w_.unsigned_integer(block.requested);
            w_.text("state");
            w_.text(state_name(block.state));
            w_.text("frames");
            write_stack(block.stack);
          });
        });
      });
    });
  }

  // PyTorch's action name, the reader's own table; empty for kinds with no
  // trace action (split, merge, empty_cache, annotations).
  static std::string_view action(EventKind kind) { return pickle::trace_action_name(kind); }

  // PyTorch keeps one trace list per device index, so the highest index
  // sizes the output; an absurd one is refused rather than written as
  // millions of empty lists. A negative one never gets here: validate()
  // refuses it (invariants.hpp).
  static std::int32_t checked_device(std::int32_t index) {
    if (index >= kMaxDevices) {
      throw SnapshotError(ErrorCode::unsupported, "device index " + std::to_string(index) +
                                                      " is too large for PyTorch's per-device trace lists (limit " +
                                                      std::to_string(kMaxDevices) + ")");
    }
    return index;
  }

  void write_traces() {
    std::int32_t devices = 1;
    for (const DeviceInfo& info : s_.devices) devices = std::max(devices, checked_device(info.index) + 1);
    for (const Segment& segment : s_.segments) devices = std::max(devices, checked_device(segment.device) + 1);
    for (const Event& event : s_.events) {
      if (!action(event.kind).empty()) devices = std::max(devices, checked_device(event.device) + 1);
    }
    std::vector<std::vector<const Event*>> per_device(static_cast<std::size_t>(devices));
    for (const Event& event : s_.events) {
      if (action(event.kind).empty()) continue;
      per_device[static_cast<std::size_t>(event.device)].push_back(&event);
    }
    w_.list(per_device.size(), [&](std::size_t d) {
      w_.list(per_device[d].size(), [&](std::size_t i) { write_event(*per_device[d][i]); });
    });
  }

  void write_event(const Event& event) {
    w_.dict([&] {
      w_.text("action");
      w_.text(action(event.kind));
      const bool block_event = event.kind == EventKind::alloc || event.kind == EventKind::free_requested ||
                               event.kind == EventKind::free_completed;
      // PyTorch names the OOM's device free bytes 'device_free' instead of 'addr'.
      w_.text(event.kind == EventKind::oom ? "device_free" : "addr");
      w_.unsigned_integer(event.address);
      w_.text("size");
      w_.unsigned_integer(block_event ? event.aux : event.size);  // PyTorch records requested bytes
      w_.text("stream");
      w_.integer(static_cast<std::int64_t>(event.stream));
      w_.text("time_us");
      w_.unsigned_integer(event.time_ns / 1000);
      w_.text("frames");
      write_stack(event.stack);
    });
  }

  void write_annotations() {
    std::vector<const Event*> annotations;
    for (const Event& event : s_.events) {
      if (event.kind == EventKind::annotation_begin || event.kind == EventKind::annotation_end)
        annotations.push_back(&event);
    }
    w_.list(annotations.size(), [&](std::size_t i) {
      const Event& event = *annotations[i];
      w_.dict([&] {
        w_.text("stage");
        w_.text(event.kind == EventKind::annotation_begin ? "START" : "END");
        w_.text("name");
        w_.text(s_.strings[event.aux]);
        w_.text("device");
        w_.integer(event.device);
        w_.text("time_us");
        w_.unsigned_integer(event.time_ns / 1000);
      });
    });
  }

  // Settings are text in the model; PyTorch's are typed. The reader writes
  // Python's repr ("True", "None", "0.0", "-1"), so the type comes back from
  // the text; "a.b" keys become nested dicts again.
  struct SettingNode {
    std::optional<std::string> value;
    std::map<std::string, SettingNode> children;
  };

  void write_setting_value(const std::string& value) {
    if (value == "True" || value == "False") return w_.boolean(value == "True");
    if (value == "None") return w_.none();
    std::int64_t integer = 0;
    const char* end = value.data() + value.size();
    if (!value.empty()) {
      const auto parsed = std::from_chars(value.data(), end, integer);
      if (parsed.ec == std::errc{} && parsed.ptr == end && value.find('+') == std::string::npos) return w_.integer(integer);
    }
    if (value.find_first_of(".eEn") != std::string::npos) {
      double number = 0;
      const auto parsed = std::from_chars(value.data(), end, number);
      if (parsed.ec == std::errc{} && parsed.ptr == end) return w_.floating(number);
    }
    w_.text(value);
  }

  void write_setting_node(const SettingNode& node) {
    w_.dict([&] {
      for (const auto& [key, child] : node.children) {
        w_.text(key);
        if (child.children.empty()) write_setting_value(child.value.value_or(""));
        else write_setting_node(child);
      }
    });
  }

  // Our recorder keeps its CACHEALLOC_CONF pairs (the canonical text's: max_split_size_mb:N,
  // roundup_power2_divisions:[1:a,2:b,...], garbage_collection_threshold:X,
  // expandable_segments:True); PyTorch 2.11's allocator_settings hold the
  // parsed values under its own names, which its tools and our reader
  // (the block sizes, the what-if replay) read. Ours get both.
  static std::map<std::string, std::string> with_pytorch_settings(std::map<std::string, std::string> settings) {
    const auto config = settings.find("config");
    if (config == settings.end() || settings.count("PYTORCH_CUDA_ALLOC_CONF") != 0) return settings;
    settings["PYTORCH_CUDA_ALLOC_CONF"] = config->second;
    std::uint64_t mib = 0;
    const auto split = settings.find("max_split_size_mb");
    // A whole number of MiB that fits in bytes (the recorder writes nothing else).
    const bool has_split = [&] {
      if (split == settings.end()) return false;
      const char* end = split->second.data() + split->second.size();
      const auto [stop, error] = std::from_chars(split->second.data(), end, mib);
      return error == std::errc{} && stop == end && mib < (std::uint64_t{1} << 43);
    }();
    settings["max_split_size"] = has_split ? std::to_string(mib << 20) : "-1";
    if (settings.count("garbage_collection_threshold") == 0) settings["garbage_collection_threshold"] = "0.0";
    if (settings.count("expandable_segments") == 0) settings["expandable_segments"] = "False";
    std::array<std::uint64_t, 16> divisions{};
    if (const auto roundup = settings.find("roundup_power2_divisions"); roundup != settings.end()) {
      const std::string& text = roundup->second;  // "[1:a,2:b,...]" or one number
      std::uint64_t all = 0;
      const auto [stop, error] = std::from_chars(text.data(), text.data() + text.size(), all);
      if (error == std::errc{} && stop == text.data() + text.size() && !text.empty()) divisions.fill(all);
      for (std::size_t at = text.find('['); at != std::string::npos && at < text.size(); at = text.find(',', at)) {
        ++at;
        std::uint64_t interval = 0;
        std::uint64_t value = 0;
        const auto [colon, e1] = std::from_chars(text.data() + at, text.data() + text.size(), interval);
        if (e1 != std::errc{} || colon == text.data() + text.size() || *colon != ':' || !std::has_single_bit(interval))
          continue;
        if (std::from_chars(colon + 1, text.data() + text.size(), value).ec != std::errc{}) continue;
        const auto index = static_cast<std::size_t>(std::countr_zero(interval));
        if (index < divisions.size()) divisions[index] = value;
      }
      settings.erase(roundup);
    }
    for (std::size_t i = 0; i < divisions.size(); ++i)
      settings["roundup_power2_divisions." + std::to_string(std::uint64_t{1} << i)] = std::to_string(divisions[i]);
    return settings;
  }

  void write_settings() {
    SettingNode root;
    std::map<std::string, std::string> all = with_pytorch_settings(s_.settings);
    all.erase(kSkippedRecordsSetting);  // the read's count, not a setting: a named loss
    for (const auto& [key, value] : all) {
      // Nest only where no plain value sits at the prefix already, and in
      // at most 3 dicts below the root: the reader flattens 4 levels of dicts
      // (the root's included), so a key of more parts keeps its rest dotted.
      SettingNode* node = &root;
      std::size_t start = 0;
      int levels = 0;
      for (std::size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', start)) {
        const std::string part = key.substr(start, dot - start);
        const auto plain = all.find(key.substr(0, dot));
        if (part.empty() || plain != all.end() || ++levels > 3) break;
        node = &node->children[part];
        start = dot + 1;
      }
      node->children[key.substr(start)].value = value;
    }
    write_setting_node(root);
  }

  const Snapshot& s_;
  PickleWriter w_;
  std::unordered_map<std::uint32_t, std::uint32_t> frame_memo_;
  std::unordered_map<std::uint32_t, std::uint32_t> stack_memo_;
};

}  // namespace

std::vector<std::byte> encode_pytorch_pickle(const Snapshot& snapshot) {
  validate(snapshot);
  return SnapshotPickler(snapshot).run();
}

std::vector<std::byte> detail::encode_pytorch_pickle_unvalidated(const Snapshot& snapshot) {
  return SnapshotPickler(snapshot).run();
}

std::vector<std::string> pickle_conversion_losses(const Snapshot& snapshot) {
  std::vector<std::string> losses;
  std::array<std::uint64_t, kEventKindCount> dropped{};
  for (const Event& event : snapshot.events) {
    const bool annotation = event.kind == EventKind::annotation_begin || event.kind == EventKind::annotation_end;
    const auto kind = static_cast<std::size_t>(event.kind);
    if (!annotation && pickle::trace_action_name(event.kind).empty() && kind < dropped.size()) ++dropped[kind];
  }
  for (std::size_t kind = 0; kind < dropped.size(); ++kind) {
    if (dropped[kind] != 0)
      losses.push_back(std::to_string(dropped[kind]) + " " + to_string(static_cast<EventKind>(kind)) + " events");
  }
  // PyTorch's oom entry holds the request and the device's free bytes, not a cap.
  const auto capped = static_cast<std::size_t>(std::count_if(snapshot.events.begin(), snapshot.events.end(), [](const Event& e) {
    return e.kind == EventKind::oom && e.aux != 0;
  }));
  if (capped != 0) losses.push_back("the allocator cap of " + std::to_string(capped) + " oom event(s)");
  // PyTorch's trace names no pool for a segment_alloc: the reader infers it
  // (trace_segment_is_large), and an expandable flag has no place at all.
  std::map<std::pair<std::int32_t, std::uint64_t>, const Segment*> final_segments;
  for (const Segment& segment : snapshot.segments) final_segments.emplace(std::pair{segment.device, segment.address}, &segment);
  const auto pools_lost = static_cast<std::size_t>(std::count_if(snapshot.events.begin(), snapshot.events.end(), [&](const Event& e) {
    if (e.kind != EventKind::segment_alloc) return false;
    const auto found = final_segments.find({e.device, e.address});
    const bool large = detail::trace_segment_is_large(found == final_segments.end() ? nullptr : found->second, e.size);
    return e.aux != (large ? std::uint64_t{segment_flag_large_pool} : 0);
  }));
  if (pools_lost != 0)
    losses.push_back("the pool flags of " + std::to_string(pools_lost) +
                     " segment_alloc event(s) whose size and final layout do not imply them");
  const Header& h = snapshot.header;
  if (!h.program.empty() || !h.arguments.empty() || h.pid != 0 || !h.host.empty() || h.dump_time_unix_ns != 0)
    losses.emplace_back("the program's name, arguments, pid, host and dump time");
  bool device_facts = false;
  for (const DeviceInfo& device : snapshot.devices) {
    device_facts = device_facts || !device.name.empty() || device.total_bytes != 0 || device.driver_total_at_dump != 0;
  }
  if (device_facts) losses.emplace_back("the device names, capacities and driver totals");
  std::size_t readings = 0;
  for (const DeviceInfo& device : snapshot.devices) readings += device.usage.size();
  if (readings != 0)
    losses.push_back(std::to_string(readings) + " NVML reading(s) of this process's and the device's memory (nvidia-smi's figures)");
  if (!snapshot.stats.empty()) losses.push_back(std::to_string(snapshot.stats.size()) + " final allocator statistics");
  if (snapshot.threads.size() > 1 || (snapshot.threads.size() == 1 && snapshot.threads[0] != 0))
    losses.emplace_back("the thread of each event");
  const auto native = static_cast<std::size_t>(std::count_if(
      snapshot.frames.begin(), snapshot.frames.end(), [](const Frame& frame) { return frame.ip != 0 || frame.module; }));
  if (native != 0)
    losses.push_back("the instruction address and module of " + std::to_string(native) + " native frame(s)");
  if (const auto skipped = snapshot.settings.find(kSkippedRecordsSetting); skipped != snapshot.settings.end())
    losses.push_back("the count of trace records skipped when the pickle was read (" + skipped->second + ")");
  if (snapshot.dropped_events != 0)
    losses.push_back("the count of events lost before the ring began (" + std::to_string(snapshot.dropped_events) + ")");
  return losses;
}

void write_pytorch_pickle(const Snapshot& snapshot, const std::filesystem::path& path) {
  const std::vector<std::byte> bytes = encode_pytorch_pickle(snapshot);  // may throw: nothing on disk yet
  pickle_file::write_atomically(path, bytes, "PyTorch snapshot");
}

}  // namespace cachealloc::snapshot
