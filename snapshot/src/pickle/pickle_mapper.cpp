// From the value tree of a PyTorch memory snapshot to the model. The mapping
// and the choices it makes are in docs/FORMAT.md, "PyTorch pickles".
#include <algorithm>
#include <array>
#include <functional>
#include <type_traits>
#include <bit>
#include <charconv>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>

#include "cachealloc/snapshot/invariants.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "pickle_block_sizes.hpp"
#include "pickle_file.hpp"
#include "format/format_v3.hpp"
#include "parallel.hpp"
#include "pickle_value.hpp"

namespace cachealloc::snapshot {

namespace {

using pickle::ContainerId;
using pickle::FieldState;
using pickle::Kind;
using pickle::TraceField;
using pickle::Tree;
using pickle::Value;

// PyTorch CUDACachingAllocator constants.
constexpr std::uint64_t kMinBlockSize = 512;          // every block is a multiple of this
constexpr std::uint64_t kSmallBuffer = 2ull << 20;    // the size of every small-pool segment

[[noreturn]] void bad(const std::string& what) {
  throw SnapshotError(ErrorCode::inconsistent, "bad PyTorch memory snapshot: " + what);
}

std::string python_repr(double value) {
  std::array<char, 64> text{};
  const auto result = std::to_chars(text.data(), text.data() + text.size(), value);
  std::string out(text.data(), result.ptr);
  // Python prints integral floats with ".0"; keep that so the writer can
  // tell a float setting from an int one.
  if (out.find_first_of(".eninf") == std::string::npos) out += ".0";
  return out;
}

// The place a message names ("segment 3", "device_traces[0][17]"), built
// only when there is something to say: formatting it for each of millions
// of trace entries cost more than reading them.
// A reference to the callable that builds it, never a copy: passing one costs
// two pointers, where a std::function per trace entry cost ~5% of reading.
class Where {
 public:
  template <class Callable, class = std::enable_if_t<!std::is_same_v<std::decay_t<Callable>, Where>>>
  Where(const Callable& callable) noexcept  // NOLINT: implicit, like std::function
      : callable_(&callable), call_([](const void* f) { return (*static_cast<const Callable*>(f))(); }) {}
  std::string operator()() const { return call_(callable_); }

 private:
  const void* callable_;
  std::string (*call_)(const void*);
};

class Mapper {
 public:
  Mapper(Tree& tree, std::size_t input_bytes, const detail::PickleReadOptions& options)
      : tree_(tree), budget_(input_bytes), threads_(std::max(options.threads, 1u)), options_(options) {}

  Snapshot run() {
    const Value root = tree_.root;
    if (root.kind == Kind::list) {
      // pickle.dump(torch.cuda.memory_snapshot()): the segments alone, as
      // _memory_viz stats reads them. No trace, no settings.
      out_.header.source = kPytorchPickleSource;
      map_segments(root);
      fill_devices({});
      out_.settings[kSegmentsOnlySetting] = "true";
      validate_in_parallel();
      return std::move(out_);
    }
    if (root.kind != Kind::dict || !find(root.container(), "segments")) {
      throw SnapshotError(ErrorCode::not_a_snapshot,
                          std::string("not a PyTorch memory snapshot: the pickle holds a ") + pickle::to_string(root.kind) +
                              (root.kind == Kind::dict ? " without 'segments'" : ", not a dict with 'segments' or a list of segments"));
    }
    const ContainerId top = root.container();
    out_.header.source = kPytorchPickleSource;
    if (const auto settings = find(top, "allocator_settings")) map_settings(*settings);
    map_segments(*find(top, "segments"));
    std::vector<std::vector<Event>> per_device;
    if (const auto traces = find(top, "device_traces")) per_device = map_traces(*traces);
    std::vector<Event> annotations;
    if (const auto list = find(top, "external_annotations")) annotations = map_annotations(*list);
    std::unordered_map<std::int32_t, std::vector<const Segment*>> segments_by_device;
    for (const Segment& segment : out_.segments) segments_by_device[segment.device].push_back(&segment);
    // One sequence of events (the usual file: one device, no annotations)
    // needs no merging, only its times made non-decreasing, which the
    // inference's pass does on the way.
    const bool one_sequence =
        annotations.empty() && std::count_if(per_device.begin(), per_device.end(), [](const auto& d) { return !d.empty(); }) == 1;
    for (std::size_t device = 0; device < per_device.size(); ++device) {
      if (per_device[device].empty()) continue;
      infer_block_sizes(per_device[device], static_cast<std::int32_t>(device),
                        segments_by_device[static_cast<std::int32_t>(device)], one_sequence);
    }
    std::vector<std::int32_t> used_devices;
    for (std::size_t d = 0; d < per_device.size(); ++d) {
      if (!per_device[d].empty()) used_devices.push_back(static_cast<std::int32_t>(d));
    }
    merge_by_time(per_device, annotations);
    fill_devices(used_devices);
    if (skipped_records_ != 0) out_.settings[kSkippedRecordsSetting] = std::to_string(skipped_records_);
    validate_in_parallel();
    return std::move(out_);
  }

 private:
  // validate(out_), with the events checked side by side; the error is the
  // one validate() would report first.
  void validate_in_parallel() {
    std::vector<Event> events = std::move(out_.events);
    out_.events.clear();
    validate(out_);  // the tables and the layout
    out_.events = std::move(events);
    std::size_t first_bad = out_.events.size();
    std::optional<SnapshotError> first_error;
    std::mutex errors;
    detail::parallel_ranges(out_.events.size(), threads_, 1u << 16, [&](std::size_t begin, std::size_t end) {
      try {
        detail::validate_events(out_, std::span<const Event>(out_.events).subspan(begin, end - begin), begin);
      } catch (const SnapshotError& error) {
        const std::lock_guard<std::mutex> lock(errors);
        if (begin < first_bad) {
          first_bad = begin;
          first_error = error;
        }
      }
    });
    if (first_error) throw *first_error;
  }

  // --- typed access ------------------------------------------------------

  // Tree::find() is a linear scan. A big dict referenced many times would
  // make that quadratic, so dicts past a few dozen keys get an index, built
  // once per container.
  std::optional<Value> find(ContainerId dict, std::string_view key) const {
    if (tree_.container(dict).shape != pickle::Shape::items || tree_.size(dict) <= 64) return tree_.find(dict, key);
    auto [it, inserted] = dict_index_.try_emplace(dict);
    if (inserted) {
      const std::size_t size = tree_.size(dict);
      for (std::size_t i = 0; i + 1 < size; i += 2) {
        const Value k = tree_.item(dict, i);
        if (k.kind == Kind::text) it->second[k.view()] = tree_.item(dict, i + 1);  // the last one wins
      }
    }
    const auto found = it->second.find(key);
    if (found == it->second.end()) return std::nullopt;
    return found->second;
  }

  static ContainerId expect(const Value& value, Kind kind, const Where& where) {
    if (value.kind != kind) {
      bad(where() + " is a " + pickle::to_string(value.kind) + ", expected a " + pickle::to_string(kind));
    }
    return value.container();
  }
  static ContainerId expect_sequence(const Value& value, const Where& where) {
    if (value.kind != Kind::list && value.kind != Kind::tuple) {
      bad(where() + " is a " + pickle::to_string(value.kind) + ", expected a list");
    }
    return value.container();
  }

  // An int field as a two's-complement 64-bit pattern: addresses and sizes
  // must be non-negative, streams may be either (PyTorch casts the pointer to int64).
  static std::uint64_t u64_of(const std::optional<Value>& field, std::string_view key, const Where& where,
                              bool allow_negative = false, std::uint64_t fallback = 0) {
    if (!field || field->kind == Kind::none) return fallback;
    const Value& value = *field;
    if (value.kind == Kind::boolean) return value.flag ? 1 : 0;
    if (value.kind != Kind::integer) {
      bad(where() + " field '" + std::string(key) + "' is a " + pickle::to_string(value.kind) + ", expected an int");
    }
    if (value.too_big || (value.flag && !allow_negative) || (value.flag && value.magnitude > (std::uint64_t{1} << 63))) {
      bad(where() + " field '" + std::string(key) + "' is out of range");
    }
    return value.flag ? std::uint64_t{0} - value.magnitude : value.magnitude;
  }
  std::uint64_t u64(ContainerId dict, std::string_view key, const Where& where, bool allow_negative = false,
                    std::uint64_t fallback = 0) const {
    return u64_of(find(dict, key), key, where, allow_negative, fallback);
  }
  std::int32_t device_index(ContainerId dict, const Where& where) const {
    const std::uint64_t raw = u64(dict, "device", where, true);
    const auto value = static_cast<std::int64_t>(raw);
    if (value < 0 || value > std::numeric_limits<std::int32_t>::max()) bad(where() + " has device " + std::to_string(value));
    return static_cast<std::int32_t>(value);
  }
  std::optional<std::string_view> text(ContainerId dict, std::string_view key) const {
    const auto value = find(dict, key);
    if (!value || value->kind != Kind::text) return std::nullopt;
    return value->view();
  }

  // Every segment, block and event costs one unit of a budget equal to the
  // input size: a memoized container referenced many times cannot make the
  // model grow faster than the file.
  void spend(const char* what) {
    if (budget_ == 0) bad(std::string("more ") + what + " than the file has bytes (a container referenced over and over)");
    --budget_;
  }

  // --- interning ----------------------------------------------------------

  StringId intern(std::string_view value) {
    if (value.empty()) return StringId{};
    const auto found = string_ids_.find(value);
    if (found != string_ids_.end()) return StringId{found->second};
    const auto id = static_cast<std::uint32_t>(out_.strings.size());
    out_.strings.emplace_back(value);
    string_ids_.emplace(value, id);
    return StringId{id};
  }
  StringId intern_field(ContainerId dict, std::string_view key) {
    const auto value = find(dict, key);
    if (!value || value->kind != Kind::text) return StringId{};
    return intern(value->view());
  }

  FrameId frame(const Value& item, const Where& where) {
    if (item.kind == Kind::dict) {
      const auto cached = frame_by_container_.find(item.container());
      if (cached != frame_by_container_.end()) return cached->second;
    }
    const ContainerId dict = expect(item, Kind::dict, where);
    Frame f;
    f.function = intern_field(dict, "name");
    f.file = intern_field(dict, "filename");
    const std::uint64_t line = u64(dict, "line", where, true);
    f.line = line > std::numeric_limits<std::uint32_t>::max() ? 0 : static_cast<std::uint32_t>(line);
    const auto key = std::make_tuple(f.file.value, f.line, f.function.value);
    const auto [it, inserted] = frame_ids_.try_emplace(key, static_cast<std::uint32_t>(out_.frames.size()));
    if (inserted) out_.frames.push_back(f);
    frame_by_container_.emplace(dict, FrameId{it->second});
    return FrameId{it->second};
  }

  // 'frames' of a record: None, absent or [] is stack 0. A frame list shared
  // by content (pickle_value.hpp) is interned once, however many lists hold it.
  StackId stack_of(const std::optional<Value>& field, const Where& where) {
    if (!field || field->kind == Kind::none) return StackId{};
    const Value& value = *field;
    const bool is_sequence = value.kind == Kind::list || value.kind == Kind::tuple;
    const pickle::Container sequence = is_sequence ? tree_.container(value.container()) : pickle::Container{};
    const bool shared = is_sequence && sequence.shape == pickle::Shape::frame_list;
    if (shared) {
      const std::uint64_t list = sequence.offset;
      if (stack_by_frame_list_.size() <= list) stack_by_frame_list_.resize(tree_.frame_lists.size(), 0);
      if (stack_by_frame_list_[list] != 0) return StackId{stack_by_frame_list_[list] - 1};
    } else if (value.kind == Kind::list || value.kind == Kind::tuple) {
      const auto cached = stack_by_container_.find(value.container());
      if (cached != stack_by_container_.end()) return cached->second;
    }
    const ContainerId list = expect_sequence(value, [&] { return where() + " frames"; });
    const std::size_t size = tree_.size(list);
    StackId result{};
    if (size != 0) {
      frames_scratch_.clear();
      for (std::size_t i = 0; i < size; ++i) {
        frames_scratch_.push_back(frame(tree_.item(list, i), [&] { return where() + " frame"; }).value);
      }
      const auto [it, inserted] = stack_ids_.try_emplace(frames_scratch_, static_cast<std::uint32_t>(out_.stacks.size()));
      if (inserted) {
        Stack s;
        s.frames.reserve(frames_scratch_.size());
        for (const std::uint32_t f : frames_scratch_) s.frames.push_back(FrameId{f});
        out_.stacks.push_back(std::move(s));
      }
      result = StackId{it->second};
    }
    if (shared) stack_by_frame_list_[sequence.offset] = result.value + 1;
    else stack_by_container_.emplace(list, result);
    return result;
  }
  StackId stack(ContainerId record, const Where& where) { return stack_of(find(record, "frames"), where); }

  // --- settings -----------------------------------------------------------

  void map_settings(const Value& settings) {
    if (settings.kind != Kind::dict) return;  // informative only: never worth rejecting a file
    settings_known_ = true;
    flatten_setting("", settings, 0);
    for (std::size_t i = 0; i < divisions_.size(); ++i) {
      const auto found = out_.settings.find("roundup_power2_divisions." + std::to_string(std::uint64_t{1} << i));
      if (found != out_.settings.end()) std::from_chars(found->second.data(), found->second.data() + found->second.size(), divisions_[i]);
    }
    if (const auto found = out_.settings.find("roundup_power2_divisions"); found != out_.settings.end()) {
      std::uint64_t all = 0;  // older PyTorch: one value for every size
      const char* end = found->second.data() + found->second.size();
      const auto [stop, error] = std::from_chars(found->second.data(), end, all);
      if (error == std::errc{} && stop == end && stop != found->second.data()) divisions_.fill(all);
    }
    if (const auto found = out_.settings.find("max_split_size"); found != out_.settings.end()) {
      std::int64_t value = -1;
      std::from_chars(found->second.data(), found->second.data() + found->second.size(), value);
      if (value > 0) max_split_size_ = static_cast<std::uint64_t>(value);
    }
  }

  // Nested dicts become "outer.inner" keys. Depth is capped: a dict may
  // contain itself, and settings are never deep.
  void flatten_setting(const std::string& prefix, const Value& value, int depth) {
    switch (value.kind) {
      case Kind::dict: {
        if (depth >= 4) return;
        const ContainerId dict = value.container();
        const std::size_t size = tree_.size(dict);
        for (std::size_t i = 0; i + 1 < size; i += 2) {
          const Value key = tree_.item(dict, i);
          std::string name;
          if (key.kind == Kind::text) name = key.view();
          else if (key.kind == Kind::integer && !key.too_big)
            name = (key.flag ? "-" : "") + std::to_string(key.magnitude);
          else continue;
          flatten_setting(prefix.empty() ? name : prefix + "." + name, tree_.item(dict, i + 1), depth + 1);
        }
        return;
      }
      case Kind::text: out_.settings[prefix] = value.view(); return;
      case Kind::boolean: out_.settings[prefix] = value.flag ? "True" : "False"; return;
      case Kind::none: out_.settings[prefix] = "None"; return;
      case Kind::floating: out_.settings[prefix] = python_repr(value.number); return;
      case Kind::integer:
        if (!value.too_big) out_.settings[prefix] = (value.flag ? "-" : "") + std::to_string(value.magnitude);
        return;
      default: return;  // lists, tuples, bytes: no setting of PyTorch's has them
    }
  }

  // --- segments -----------------------------------------------------------

  void map_segments(const Value& value) {
    const ContainerId list = expect_sequence(value, [] { return std::string("'segments'"); });
    const std::size_t count = tree_.size(list);
    out_.segments.reserve(std::min<std::size_t>(count, budget_));
    for (std::size_t s = 0; s < count; ++s) {
      spend("segments");
      const auto where = [s] { return "segment " + std::to_string(s); };
      const ContainerId dict = expect(tree_.item(list, s), Kind::dict, where);
      Segment segment;
      segment.device = device_index(dict, where);
      segment.address = u64(dict, "address", where);
      segment.total_size = u64(dict, "total_size", where);
      segment.stream = u64(dict, "stream", where, true);
      const auto type = text(dict, "segment_type");
      segment.large_pool = type ? *type == "large" : segment.total_size > kSmallBuffer;
      segment.expandable = u64(dict, "is_expandable", where) != 0;
      segment.stack = stack(dict, where);
      if (const auto blocks = find(dict, "blocks")) {
        const ContainerId block_list = expect_sequence(*blocks, [&] { return where() + " 'blocks'"; });
        const std::size_t block_count = tree_.size(block_list);
        segment.blocks.reserve(std::min<std::size_t>(block_count, budget_));
        for (std::size_t b = 0; b < block_count; ++b) {
          spend("blocks");
          segment.blocks.push_back(
              map_block(tree_.item(block_list, b), [&] { return "block " + std::to_string(b) + " of " + where(); }));
        }
      }
      std::stable_sort(segment.blocks.begin(), segment.blocks.end(),
                       [](const Block& a, const Block& b) { return a.address < b.address; });
      check_blocks(segment, where);
      out_.segments.push_back(std::move(segment));
    }
    std::stable_sort(out_.segments.begin(), out_.segments.end(), [](const Segment& a, const Segment& b) {
      return std::tie(a.device, a.address) < std::tie(b.device, b.address);
    });
  }

  Block map_block(const Value& value, const Where& where) {
    const ContainerId dict = expect(value, Kind::dict, where);
    Block block;
    block.address = u64(dict, "address", where);
    block.size = u64(dict, "size", where);
    const auto state = text(dict, "state");
    if (!state) bad(where() + " has no 'state'");
    if (*state == "active_allocated") block.state = BlockState::active_allocated;
    else if (*state == "active_pending_free") block.state = BlockState::active_pending_free;
    else if (*state == "inactive") block.state = BlockState::inactive;
    else bad(where() + " has unknown state '" + std::string(state->substr(0, 64)) + "'");
    // PyTorch leaves the last request's size on a cached block; the model
    // says requested is 0 when inactive.
    block.requested = block.state == BlockState::inactive ? 0 : u64(dict, "requested_size", where);
    block.stack = stack(dict, where);
    return block;
  }

  // The model promises blocks inside their segment and apart; the analyzer
  // relies on it, so a file that breaks it is rejected here.
  static void check_blocks(const Segment& segment, const Where& where) {
    std::uint64_t cursor = segment.address;
    const std::uint64_t end = segment.address + segment.total_size;
    if (end < segment.address) bad(where() + " wraps around the address space");
    for (const Block& block : segment.blocks) {
      if (block.address < cursor || block.size > end - block.address || block.address > end) {
        bad(where() + " has a block at " + std::to_string(block.address) + " that overlaps another or leaves the segment");
      }
      cursor = block.address + block.size;
    }
  }

  // --- traces -------------------------------------------------------------

  std::vector<std::vector<Event>> map_traces(const Value& value) {
    const ContainerId devices = expect_sequence(value, [] { return std::string("'device_traces'"); });
    const std::size_t device_count = tree_.size(devices);
    std::vector<std::vector<Event>> per_device(device_count);
    if (device_count > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) bad("too many devices");
    if (device_count == 1 && map_trace_in_place(tree_.item(devices, 0), per_device[0])) return per_device;
    for (std::size_t d = 0; d < device_count; ++d) {
      const ContainerId trace = expect_sequence(tree_.item(devices, d), [d] { return "device_traces[" + std::to_string(d) + "]"; });
      const std::size_t count = tree_.size(trace);
      per_device[d].reserve(std::min<std::size_t>(count, budget_));
      for (std::size_t i = 0; i < count; ++i) {
        spend("events");
        const auto where = [d, i] { return "device_traces[" + std::to_string(d) + "][" + std::to_string(i) + "]"; };
        if (auto event = map_event(tree_.item(trace, i), static_cast<std::int32_t>(d), where)) per_device[d].push_back(*event);
      }
    }
    return per_device;
  }

  // The usual file: one device whose trace lists every TraceEntry of the
  // pickle, in order. Tree::traces becomes the events where it lies, so the
  // trace costs one Event per entry at its peak, not two.
  bool map_trace_in_place(const Value& value, std::vector<Event>& out) {
    if (value.kind != Kind::list) return false;
    const pickle::Container run = tree_.container(value.container());
    const std::size_t count = run.size;
    if (run.shape != pickle::Shape::trace_run || run.offset != 0 || count != tree_.traces.size() || count > budget_ ||
        tree_.trace_entry_detached) {
      return false;
    }
    // Read again later (the same list as 'external_annotations'): keep it.
    const auto annotations = find(tree_.root.container(), "external_annotations");
    if (annotations && annotations->is_container() && annotations->container() == value.container()) return false;
    out = std::move(tree_.traces);
    tree_.traces.clear();  // each entry is read before it is overwritten; nothing reads them after
    budget_ -= count;
    const auto where = [](std::size_t i) {
      return [i] { return "device_traces[0][" + std::to_string(i) + "]"; };
    };
    // Stacks first, in order, so they are numbered by first use whatever the
    // threads do; it stops at the first entry whose frames are bad.
    std::size_t stacks_done = stacks_in_parallel(out) ? count : 0;
    std::optional<SnapshotError> stack_error;
    try {
      for (; stacks_done < count; ++stacks_done) {
        Event& entry = out[stacks_done];
        entry.stack = pickle::field_state(entry, TraceField::frames) == FieldState::absent
                          ? StackId{}
                          : stack_of(tree_.trace_value(entry, TraceField::frames), where(stacks_done));
      }
    } catch (const SnapshotError& error) {
      stack_error = error;
    }
    // The rest of each entry on its own: side by side. The error reported is
    // the first in trace order, as one thread would meet it.
    std::size_t first_bad = stacks_done;
    std::optional<SnapshotError> first_error = stack_error;
    std::mutex errors;
    detail::parallel_ranges(stacks_done, threads_, 1u << 16, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        try {
          out[i] = map_trace_entry(out[i], out[i].stack, 0, where(i));
        } catch (const SnapshotError& error) {
          const std::lock_guard<std::mutex> lock(errors);
          if (i < first_bad) {
            first_bad = i;
            first_error = error;
          }
          return;
        }
      }
    });
    if (first_error) throw *first_error;
    return true;
  }

  // The usual trace names its frames by shared frame lists (or by none, or
  // an empty list): then each entry's stack is that of its FrameList, and
  // the stacks can be numbered by first use from each list's first entry.
  // Two passes side by side around a short sequential one; false, having
  // set nothing, when some entry's frames are anything else (the one-thread
  // pass then handles them, errors included).
  bool stacks_in_parallel(std::vector<Event>& entries) {
    constexpr std::uint32_t kUnused = std::numeric_limits<std::uint32_t>::max();
    const std::size_t lists = tree_.frame_lists.size();
    if (threads_ < 2 || entries.size() >= kUnused || lists > (std::size_t{1} << 18)) return false;
    struct FirstUse {
      std::uint32_t entry = kUnused;
      ContainerId container = 0;
    };
    // Pass 1: each entry's FrameList number + 1 (0: no stack) parked in its
    // stack field, and each list's first entry per range.
    std::vector<std::vector<FirstUse>> firsts;
    std::mutex mutex;
    bool other = false;
    detail::parallel_ranges(entries.size(), threads_, 1u << 16, [&](std::size_t begin, std::size_t end) {
      std::vector<FirstUse> first(lists);
      bool plain = true;
      for (std::size_t i = begin; i < end && plain; ++i) {
        Event& entry = entries[i];
        std::uint32_t parked = 0;
        if (pickle::field_state(entry, TraceField::frames) == FieldState::container) {
          const pickle::Container c = tree_.container(entry.thread);
          if ((c.kind != Kind::list && c.kind != Kind::tuple) ||
              (c.shape != pickle::Shape::frame_list && !(c.shape == pickle::Shape::items && c.size == 0))) {
            plain = false;
            break;
          }
          if (c.shape == pickle::Shape::frame_list) {
            parked = static_cast<std::uint32_t>(c.offset + 1);
            if (first[c.offset].entry == kUnused) first[c.offset] = FirstUse{static_cast<std::uint32_t>(i), entry.thread};
          }
        } else if (pickle::field_state(entry, TraceField::frames) != FieldState::absent &&
                   pickle::field_state(entry, TraceField::frames) != FieldState::none) {
          plain = false;
          break;
        }
        entry.stack = StackId{parked};
      }
      const std::lock_guard<std::mutex> lock(mutex);
      other = other || !plain;
      firsts.push_back(std::move(first));
    });
    if (other) return false;  // what pass 1 parked is overwritten by the one-thread pass
    // Number the lists' stacks in order of first use.
    std::vector<FirstUse> first(lists);
    for (const auto& range : firsts) {
      for (std::size_t n = 0; n < lists; ++n) {
        if (range[n].entry < first[n].entry) first[n] = range[n];
      }
    }
    std::vector<std::uint32_t> order;
    for (std::size_t n = 0; n < lists; ++n) {
      if (first[n].entry != kUnused) order.push_back(static_cast<std::uint32_t>(n));
    }
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) { return first[a].entry < first[b].entry; });
    try {
      for (const std::uint32_t n : order) {
        Value list;
        list.kind = tree_.container(first[n].container).kind;
        list.length = first[n].container;
        const std::size_t at = first[n].entry;
        stack_of(list, [at] { return "device_traces[0][" + std::to_string(at) + "]"; });
      }
    } catch (const SnapshotError&) {
      return false;  // a bad frame: the one-thread pass reports the first error in trace order
    }
    // Pass 2: the parked numbers become stacks.
    detail::parallel_ranges(entries.size(), threads_, 1u << 16, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        const std::uint32_t parked = entries[i].stack.value;
        entries[i].stack = parked == 0 ? StackId{} : StackId{stack_by_frame_list_[parked - 1] - 1};
      }
    });
    return true;
  }

  static std::uint64_t time_ns_of(std::uint64_t us, const Where& where) {
    if (us > std::numeric_limits<std::uint64_t>::max() / 1000) bad(where() + " has time_us out of range");
    return us * 1000;
  }

  // A TraceEntry (pickle_value.hpp): the same mapping as map_event(), read
  // from the packed fields without a key lookup.
  Event map_trace_entry(const Event& entry, std::int32_t device, const Where& where) {
    const StackId stack = pickle::field_state(entry, TraceField::frames) == FieldState::absent
                              ? StackId{}
                              : stack_of(tree_.trace_value(entry, TraceField::frames), where);
    return map_trace_entry(entry, stack, device, where);
  }
  // With the stack already known: touches nothing shared, so threads may
  // map entries side by side.
  Event map_trace_entry(const Event& entry, StackId stack, std::int32_t device, const Where& where) const {
    const auto field = [&](TraceField f) { return tree_.trace_value(entry, f); };
    const auto number = [&](TraceField f, bool allow_negative) {
      const FieldState state = pickle::field_state(entry, f);
      // The common case without building a Value: a non-negative int.
      if (state == FieldState::integer) return pickle::trace_slot(entry, f);
      return u64_of(field(f), pickle::trace_key(f), where, allow_negative);
    };
    Event event;
    event.kind = entry.kind;
    event.device = device;
    event.time_ns = time_ns_of(number(TraceField::time_us, false), where);
    event.stream = number(TraceField::stream, true);
    event.stack = stack;
    const std::uint64_t size = number(TraceField::size, false);
    event.size = size;
    if (event.kind == EventKind::oom) {
      event.address = pickle::field_state(entry, TraceField::device_free) != FieldState::absent
                          ? number(TraceField::device_free, false)
                          : number(TraceField::addr, false);
      return event;
    }
    event.address = number(TraceField::addr, false);
    if (event.kind == EventKind::alloc || event.kind == EventKind::free_requested ||
        event.kind == EventKind::free_completed) {
      event.aux = size;  // PyTorch records the requested bytes; the block size comes later
    }
    return event;
  }

  std::optional<Event> map_event(const Value& value, std::int32_t device, const Where& where) {
    const ContainerId dict = expect(value, Kind::dict, where);
    const pickle::Container c = tree_.container(dict);
    if (c.shape == pickle::Shape::trace_entry && c.offset < tree_.traces.size()) {
      return map_trace_entry(tree_.traces[c.offset], device, where);
    }
    const auto action = text(dict, "action");
    if (!action) bad(where() + " has no 'action'");
    Event event;
    if (*action == "alloc") event.kind = EventKind::alloc;
    else if (*action == "free_requested") event.kind = EventKind::free_requested;
    else if (*action == "free_completed") event.kind = EventKind::free_completed;
    else if (*action == "segment_alloc") event.kind = EventKind::segment_alloc;
    else if (*action == "segment_free") event.kind = EventKind::segment_release;
    else if (*action == "segment_map") event.kind = EventKind::segment_map;
    else if (*action == "segment_unmap") event.kind = EventKind::segment_unmap;
    else if (*action == "snapshot") event.kind = EventKind::snapshot;
    else if (*action == "oom") event.kind = EventKind::oom;
    else {
      // A newer PyTorch's action: keep the rest of the file readable.
      ++skipped_records_;
      return std::nullopt;
    }
    event.device = device;
    event.time_ns = time_ns_of(u64(dict, "time_us", where), where);
    event.stream = u64(dict, "stream", where, true);
    event.stack = stack(dict, where);
    const std::uint64_t size = u64(dict, "size", where);
    if (event.kind == EventKind::oom) {
      event.address = find(dict, "device_free") ? u64(dict, "device_free", where) : u64(dict, "addr", where);
      event.size = size;
      return event;
    }
    event.address = u64(dict, "addr", where);
    if (event.kind == EventKind::alloc || event.kind == EventKind::free_requested ||
        event.kind == EventKind::free_completed) {
      event.aux = size;  // PyTorch records the requested bytes; the block size comes later
      event.size = size;
    } else {
      event.size = size;
    }
    return event;
  }

  std::vector<Event> map_annotations(const Value& value) {
    std::vector<Event> out;
    if (value.kind != Kind::list && value.kind != Kind::tuple) return out;
    const ContainerId list = value.container();
    const std::size_t count = tree_.size(list);
    out.reserve(std::min<std::size_t>(count, budget_));
    for (std::size_t i = 0; i < count; ++i) {
      spend("annotations");
      const auto where = [i] { return "external_annotations[" + std::to_string(i) + "]"; };
      const ContainerId dict = expect(tree_.item(list, i), Kind::dict, where);
      const auto stage = text(dict, "stage");
      Event event;
      if (stage && *stage == "START") event.kind = EventKind::annotation_begin;
      else if (stage && *stage == "END") event.kind = EventKind::annotation_end;
      else {
        ++skipped_records_;
        continue;
      }
      event.device = device_index(dict, where);
      event.time_ns = time_ns_of(u64(dict, "time_us", where), where);
      event.aux = intern_field(dict, "name").value;
      out.push_back(event);
    }
    return out;
  }

  // --- block sizes ----------------------------------------------------------

  // PyTorch's trace records requested bytes; the model wants the block size
  // (pickle_block_sizes.hpp). `clamp_time`: also raise each time to at least
  // the one before.
  void infer_block_sizes(std::vector<Event>& events, std::int32_t device, const std::vector<const Segment*>& segments,
                         bool clamp_time) {
    detail::BlockSizeInput input;
    input.policy = policy();
    input.segments = segments;
    input.clamp_time = clamp_time;
    input.threads = threads_;
    input.min_parallel_events = options_.min_parallel_sizing_events;
    const detail::BlockSizeFacts facts = detail::infer_block_sizes(events, input);
    if (facts.per_segment && options_.stats != nullptr) ++options_.stats->block_sizes_per_segment;
    if (facts.begins_mid_run) out_.settings["trace_may_begin_mid_run"] = "true";
    // How the block sizes were found, for the analyzer's bounds
    // (analyzer/src/reports/report_helpers.cpp reads these keys): per
    // device ("block_sizes.inferred.1"), each device's trace being sized
    // on its own, and over the file (the sums, which readers before the
    // per-device keys read).
    const std::string suffix = "." + std::to_string(device);
    out_.settings[std::string(kInferredBlockSizesSetting) + suffix] = std::to_string(facts.inferred);
    out_.settings[std::string(kContradictedBlockSizesSetting) + suffix] = std::to_string(facts.contradicted);
    inferred_sizes_ += facts.inferred;
    contradicted_sizes_ += facts.contradicted;
    out_.settings[kInferredBlockSizesSetting] = std::to_string(inferred_sizes_);
    out_.settings[kContradictedBlockSizesSetting] = std::to_string(contradicted_sizes_);
    out_.settings["block_sizes.policy"] = settings_known_ ? "allocator_settings" : "defaults (no allocator_settings)";
  }

  // PyTorch's policy as the snapshot's allocator_settings describe it.
  detail::BlockPolicy policy() const {
    detail::BlockPolicy p;
    p.divisions = divisions_;
    p.max_split_size = max_split_size_;
    const auto found = out_.settings.find("expandable_segments");
    p.expandable_segments = found != out_.settings.end() && found->second == "True";
    // Without allocator_settings the trace still shows expandable segments.
    for (const Segment& segment : out_.segments) p.expandable_segments = p.expandable_segments || segment.expandable;
    return p;
  }

  // --- assembly -----------------------------------------------------------

  // Merges the per-device traces and the annotations by time, keeping each
  // sequence's own order. The model wants time_ns never to decrease; a
  // sequence that goes back in time is clamped rather than reordered.
  void merge_by_time(std::vector<std::vector<Event>>& per_device, std::vector<Event>& annotations) {
    // A heap of sequence heads: O(n log k), however many devices the file lists.
    std::vector<std::vector<Event>*> sequences;
    for (auto& trace : per_device) sequences.push_back(&trace);
    sequences.push_back(&annotations);
    // One sequence (the usual file: one device, no annotations): it becomes
    // the events as it is, clamped, with no copy.
    if (std::count_if(sequences.begin(), sequences.end(), [](const auto* s) { return !s->empty(); }) == 1) {
      std::vector<Event>* only = *std::find_if(sequences.begin(), sequences.end(), [](const auto* s) { return !s->empty(); });
      out_.events = std::move(*only);
      if (only == &annotations) {  // a device's trace was clamped by infer_block_sizes()
        std::uint64_t last = 0;
        for (Event& event : out_.events) {
          event.time_ns = std::max(event.time_ns, last);
          last = event.time_ns;
        }
      }
      return;
    }
    // Each sequence clamped on its own first, so that the merge places an
    // event by the time it ends up with: a pickle written from the result
    // (whose times are those) reads back in the same order. Placed by a time
    // its sequence then raised, an annotation could precede an event of the
    // microsecond it was raised to, and follow it once written and read again.
    std::size_t total = 0;
    for (auto* sequence : sequences) {
      std::uint64_t last = 0;
      for (Event& event : *sequence) {
        event.time_ns = std::max(event.time_ns, last);
        last = event.time_ns;
      }
      total += sequence->size();
    }
    out_.events.reserve(total);
    // An annotation that starts at the same microsecond as an event encloses
    // it; one that ends then, follows it.
    const auto rank = [](const Event& e) {
      return e.kind == EventKind::annotation_begin ? 0 : e.kind == EventKind::annotation_end ? 2 : 1;
    };
    using Head = std::tuple<std::uint64_t, int, std::size_t>;  // time, rank, sequence
    std::priority_queue<Head, std::vector<Head>, std::greater<>> heads;
    std::vector<std::size_t> next(sequences.size(), 0);
    for (std::size_t s = 0; s < sequences.size(); ++s) {
      if (!sequences[s]->empty()) heads.emplace(sequences[s]->front().time_ns, rank(sequences[s]->front()), s);
    }
    std::uint64_t last_time = 0;
    while (!heads.empty()) {
      const std::size_t s = std::get<2>(heads.top());
      heads.pop();
      Event event = (*sequences[s])[next[s]++];
      if (next[s] < sequences[s]->size()) {
        const Event& following = (*sequences[s])[next[s]];
        heads.emplace(following.time_ns, rank(following), s);
      }
      event.time_ns = std::max(event.time_ns, last_time);
      last_time = event.time_ns;
      out_.events.push_back(event);
    }
  }

  void fill_devices(const std::vector<std::int32_t>& trace_devices) {
    std::set<std::int32_t> used(trace_devices.begin(), trace_devices.end());
    for (const Segment& segment : out_.segments) used.insert(segment.device);
    for (const std::int32_t index : used) {
      DeviceInfo info;
      info.index = index;  // PyTorch's snapshot names no device and no capacity
      out_.devices.push_back(info);
    }
  }

  Tree& tree_;
  std::size_t budget_;
  Snapshot out_;
  std::array<std::uint64_t, 16> divisions_{};
  std::uint64_t max_split_size_ = std::numeric_limits<std::uint64_t>::max();
  bool settings_known_ = false;
  std::uint64_t skipped_records_ = 0;
  std::uint64_t inferred_sizes_ = 0;      // block_sizes.inferred, over the devices so far
  std::uint64_t contradicted_sizes_ = 0;  // block_sizes.contradicted, likewise
  unsigned threads_ = 1;
  const detail::PickleReadOptions& options_;
  mutable std::unordered_map<ContainerId, std::unordered_map<std::string_view, Value>> dict_index_;
  // Keys view the input or static text, both alive until run() returns.
  std::unordered_map<std::string_view, std::uint32_t> string_ids_;
  std::unordered_map<ContainerId, FrameId> frame_by_container_;
  std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, std::uint32_t> frame_ids_;
  std::vector<std::uint32_t> stack_by_frame_list_;  // StackId + 1 per FrameList, 0 = not yet
  std::unordered_map<ContainerId, StackId> stack_by_container_;
  std::map<std::vector<std::uint32_t>, std::uint32_t> stack_ids_;
  std::vector<std::uint32_t> frames_scratch_;
};

}  // namespace

std::uint64_t detail::pytorch_round_size(std::uint64_t requested,
                                         std::span<const std::uint64_t, 16> divisions_by_interval) noexcept {
  if (requested < kMinBlockSize) return kMinBlockSize;
  // roundup_power2_divisions(size): index 0 up to 2 MiB, then one per power of two.
  const int log_size = std::bit_width(requested) - 1;
  const int index = std::clamp(log_size - 20, 0, 15);
  const std::uint64_t divisions = divisions_by_interval[static_cast<std::size_t>(index)];
  if (divisions > 1 && requested > kMinBlockSize * divisions) {
    // roundup_power2_next_division()
    if (std::has_single_bit(requested)) return requested;
    const std::uint64_t floor = std::bit_floor(requested);
    const std::uint64_t division = floor >> (std::bit_width(divisions) - 1);
    if (division == 0) return floor << 1;
    const std::uint64_t rounded_down = requested & ~(division - 1);
    return rounded_down == requested ? requested : rounded_down + division;
  }
  if (requested > std::numeric_limits<std::uint64_t>::max() - kMinBlockSize) return requested;
  return kMinBlockSize * ((requested + kMinBlockSize - 1) / kMinBlockSize);
}

bool has_pickle_header(std::span<const std::byte> bytes) noexcept {
  return bytes.size() >= 2 && bytes[0] == std::byte{0x80} && std::to_integer<unsigned>(bytes[1]) >= 2 &&
         std::to_integer<unsigned>(bytes[1]) <= 5;
}

Snapshot decode_pytorch_pickle(std::span<const std::byte> bytes) {
  return detail::decode_pytorch_pickle(bytes, detail::PickleReadOptions{});
}

Snapshot detail::decode_pytorch_pickle(std::span<const std::byte> bytes, const PickleReadOptions& options) {
  PickleReadOptions settings = options;
  if (settings.threads == 0) settings.threads = detail::reader_threads();
  pickle::Tree tree = pickle::parse(bytes, settings);
  Snapshot snapshot = Mapper(tree, bytes.size(), settings).run();
  // The rules our format's reader holds its files to too (invariants.hpp).
  if (const std::optional<std::string> problem = layout_problem(snapshot)) bad(*problem);
  return snapshot;
}

Snapshot read_pytorch_pickle(const std::filesystem::path& path) {
  const pickle_file::FileBytes file(path, "PyTorch snapshot");
  return decode_pytorch_pickle(file.bytes());
}

}  // namespace cachealloc::snapshot
