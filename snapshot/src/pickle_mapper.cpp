// From the value tree of a PyTorch memory snapshot to the model. The mapping
// and the choices it makes are in docs/FORMAT.md, "PyTorch pickles".
#include <algorithm>
#include <array>
#include <functional>
#include <bit>
#include <charconv>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "cachealloc/snapshot/pickle.hpp"
#include "pickle_file.hpp"
#include "pickle_value.hpp"

namespace cachealloc::snapshot {

namespace {

using pickle::Kind;
using pickle::Node;
using pickle::NodeId;
using pickle::Tree;

// PyTorch CUDACachingAllocator constants.
constexpr std::uint64_t kMinBlockSize = 512;          // every block is a multiple of this
constexpr std::uint64_t kSmallSize = 1ull << 20;      // requests up to this go to the small pool
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

class Mapper {
 public:
  Mapper(const Tree& tree, std::size_t input_bytes) : tree_(tree), budget_(input_bytes) {}

  Snapshot run() {
    const Node& root = tree_[tree_.root];
    if (root.kind != Kind::dict || find(root, "segments") == nullptr) {
      throw SnapshotError(ErrorCode::not_a_snapshot,
                          std::string("not a PyTorch memory snapshot: the pickle holds a ") + pickle::to_string(root.kind) +
                              (root.kind == Kind::dict ? " without 'segments'" : ", not a dict with 'segments'"));
    }
    out_.header.source = kPytorchPickleSource;
    if (const NodeId* settings = find(root, "allocator_settings")) map_settings(*settings);
    map_segments(*find(root, "segments"));
    std::vector<std::vector<Event>> per_device;
    if (const NodeId* traces = find(root, "device_traces")) per_device = map_traces(*traces);
    std::vector<Event> annotations;
    if (const NodeId* list = find(root, "external_annotations")) annotations = map_annotations(*list);
    std::unordered_map<std::int32_t, std::vector<const Segment*>> segments_by_device;
    for (const Segment& segment : out_.segments) segments_by_device[segment.device].push_back(&segment);
    for (std::size_t device = 0; device < per_device.size(); ++device) {
      if (per_device[device].empty()) continue;
      infer_block_sizes(per_device[device], segments_by_device[static_cast<std::int32_t>(device)]);
    }
    merge_by_time(per_device, annotations);
    fill_devices(per_device);
    if (skipped_records_ != 0) out_.settings["pytorch_skipped_records"] = std::to_string(skipped_records_);
    validate(out_);
    return std::move(out_);
  }

 private:
  // --- typed access ------------------------------------------------------

  // pickle::find() is a linear scan. A big dict referenced many times would
  // make that quadratic, so dicts past a few dozen keys get an index, built
  // once per node.
  const NodeId* find(const Node& dict, std::string_view key) const {
    if (dict.items.size() <= 64) return pickle::find(tree_, dict, key);
    auto [it, inserted] = dict_index_.try_emplace(&dict);
    if (inserted) {
      for (std::size_t i = 0; i + 1 < dict.items.size(); i += 2) {
        const Node& k = tree_[dict.items[i]];
        if (k.kind == Kind::text) it->second[k.text] = &dict.items[i + 1];  // the last one wins
      }
    }
    const auto found = it->second.find(key);
    return found == it->second.end() ? nullptr : found->second;
  }

  const Node& expect(NodeId id, Kind kind, const std::string& where) const {
    const Node& node = tree_[id];
    if (node.kind != kind) {
      bad(where + " is a " + pickle::to_string(node.kind) + ", expected a " + pickle::to_string(kind));
    }
    return node;
  }
  const Node& expect_sequence(NodeId id, const std::string& where) const {
    const Node& node = tree_[id];
    if (node.kind != Kind::list && node.kind != Kind::tuple) {
      bad(where + " is a " + pickle::to_string(node.kind) + ", expected a list");
    }
    return node;
  }

  // An int field as a two's-complement 64-bit pattern: addresses and sizes
  // must be non-negative, streams may be either (PyTorch casts the pointer to int64).
  std::uint64_t u64(const Node& dict, std::string_view key, const std::string& where, bool allow_negative = false,
                    std::uint64_t fallback = 0) const {
    const NodeId* id = find(dict, key);
    if (id == nullptr || tree_[*id].kind == Kind::none) return fallback;
    const Node& node = tree_[*id];
    if (node.kind == Kind::boolean) return node.flag ? 1 : 0;
    if (node.kind != Kind::integer) {
      bad(where + " field '" + std::string(key) + "' is a " + pickle::to_string(node.kind) + ", expected an int");
    }
    const pickle::Integer& value = node.integer;
    if (value.too_big || (value.negative && !allow_negative) ||
        (value.negative && value.magnitude > (std::uint64_t{1} << 63))) {
      bad(where + " field '" + std::string(key) + "' is out of range");
    }
    return value.negative ? std::uint64_t{0} - value.magnitude : value.magnitude;
  }
  std::int32_t device_index(const Node& dict, const std::string& where) const {
    const std::uint64_t raw = u64(dict, "device", where, true);
    const auto value = static_cast<std::int64_t>(raw);
    if (value < 0 || value > std::numeric_limits<std::int32_t>::max()) bad(where + " has device " + std::to_string(value));
    return static_cast<std::int32_t>(value);
  }
  const std::string* text(const Node& dict, std::string_view key) const {
    const NodeId* id = find(dict, key);
    if (id == nullptr || tree_[*id].kind != Kind::text) return nullptr;
    return &tree_[*id].text;
  }

  // Every segment, block and event costs one unit of a budget equal to the
  // input size: a memoized container referenced many times cannot make the
  // model grow faster than the file.
  void spend(const char* what) {
    if (budget_ == 0) bad(std::string("more ") + what + " than the file has bytes (a container referenced over and over)");
    --budget_;
  }

  // --- interning ----------------------------------------------------------

  StringId intern(const std::string& value) {
    if (value.empty()) return StringId{};
    const auto [it, inserted] = string_ids_.try_emplace(value, static_cast<std::uint32_t>(out_.strings.size()));
    if (inserted) out_.strings.push_back(value);
    return StringId{it->second};
  }
  StringId intern_node(const Node& dict, std::string_view key) {
    const NodeId* id = find(dict, key);
    if (id == nullptr || tree_[*id].kind != Kind::text) return StringId{};
    const auto cached = string_by_node_.find(*id);
    if (cached != string_by_node_.end()) return cached->second;
    const StringId result = intern(tree_[*id].text);
    string_by_node_.emplace(*id, result);
    return result;
  }

  FrameId frame(NodeId id, const std::string& where) {
    const auto cached = frame_by_node_.find(id);
    if (cached != frame_by_node_.end()) return cached->second;
    const Node& dict = expect(id, Kind::dict, where);
    Frame f;
    f.function = intern_node(dict, "name");
    f.file = intern_node(dict, "filename");
    const std::uint64_t line = u64(dict, "line", where, true);
    f.line = line > std::numeric_limits<std::uint32_t>::max() ? 0 : static_cast<std::uint32_t>(line);
    const auto key = std::make_tuple(f.file.value, f.line, f.function.value);
    const auto [it, inserted] = frame_ids_.try_emplace(key, static_cast<std::uint32_t>(out_.frames.size()));
    if (inserted) out_.frames.push_back(f);
    frame_by_node_.emplace(id, FrameId{it->second});
    return FrameId{it->second};
  }

  // 'frames' of a record: None, absent or [] is stack 0.
  StackId stack(const Node& record, const std::string& where) {
    const NodeId* id = find(record, "frames");
    if (id == nullptr || tree_[*id].kind == Kind::none) return StackId{};
    const auto cached = stack_by_node_.find(*id);
    if (cached != stack_by_node_.end()) return cached->second;
    const Node& list = expect_sequence(*id, where + " frames");
    StackId result{};
    if (!list.items.empty()) {
      std::vector<std::uint32_t> frames;
      frames.reserve(list.items.size());
      for (const NodeId item : list.items) frames.push_back(frame(item, where + " frame").value);
      const auto [it, inserted] = stack_ids_.try_emplace(frames, static_cast<std::uint32_t>(out_.stacks.size()));
      if (inserted) {
        Stack s;
        s.frames.reserve(frames.size());
        for (const std::uint32_t f : frames) s.frames.push_back(FrameId{f});
        out_.stacks.push_back(std::move(s));
      }
      result = StackId{it->second};
    }
    stack_by_node_.emplace(*id, result);
    return result;
  }

  // --- settings -----------------------------------------------------------

  void map_settings(NodeId id) {
    if (tree_[id].kind != Kind::dict) return;  // informative only: never worth rejecting a file
    flatten_setting("", id, 0);
    for (std::size_t i = 0; i < divisions_.size(); ++i) {
      const auto found = out_.settings.find("roundup_power2_divisions." + std::to_string(std::uint64_t{1} << i));
      if (found != out_.settings.end()) std::from_chars(found->second.data(), found->second.data() + found->second.size(), divisions_[i]);
    }
    if (const auto found = out_.settings.find("roundup_power2_divisions"); found != out_.settings.end()) {
      std::uint64_t all = 0;  // older PyTorch: one value for every size
      std::from_chars(found->second.data(), found->second.data() + found->second.size(), all);
      divisions_.fill(all);
    }
    if (const auto found = out_.settings.find("max_split_size"); found != out_.settings.end()) {
      std::int64_t value = -1;
      std::from_chars(found->second.data(), found->second.data() + found->second.size(), value);
      if (value > 0) max_split_size_ = static_cast<std::uint64_t>(value);
    }
  }

  // Nested dicts become "outer.inner" keys. Depth is capped: a dict may
  // contain itself, and settings are never deep.
  void flatten_setting(const std::string& prefix, NodeId id, int depth) {
    const Node& node = tree_[id];
    switch (node.kind) {
      case Kind::dict:
        if (depth >= 4) return;
        for (std::size_t i = 0; i + 1 < node.items.size(); i += 2) {
          const Node& key = tree_[node.items[i]];
          std::string name;
          if (key.kind == Kind::text) name = key.text;
          else if (key.kind == Kind::integer && !key.integer.too_big)
            name = (key.integer.negative ? "-" : "") + std::to_string(key.integer.magnitude);
          else continue;
          flatten_setting(prefix.empty() ? name : prefix + "." + name, node.items[i + 1], depth + 1);
        }
        return;
      case Kind::text: out_.settings[prefix] = node.text; return;
      case Kind::boolean: out_.settings[prefix] = node.flag ? "True" : "False"; return;
      case Kind::none: out_.settings[prefix] = "None"; return;
      case Kind::floating: out_.settings[prefix] = python_repr(node.number); return;
      case Kind::integer:
        if (!node.integer.too_big)
          out_.settings[prefix] = (node.integer.negative ? "-" : "") + std::to_string(node.integer.magnitude);
        return;
      default: return;  // lists, tuples, bytes: no setting of PyTorch's has them
    }
  }

  // --- segments -----------------------------------------------------------

  void map_segments(NodeId id) {
    const Node& list = expect_sequence(id, "'segments'");
    out_.segments.reserve(std::min<std::size_t>(list.items.size(), budget_));
    for (std::size_t s = 0; s < list.items.size(); ++s) {
      spend("segments");
      const std::string where = "segment " + std::to_string(s);
      const Node& dict = expect(list.items[s], Kind::dict, where);
      Segment segment;
      segment.device = device_index(dict, where);
      segment.address = u64(dict, "address", where);
      segment.total_size = u64(dict, "total_size", where);
      segment.stream = u64(dict, "stream", where, true);
      const std::string* type = text(dict, "segment_type");
      segment.large_pool = type != nullptr ? *type == "large" : segment.total_size > kSmallBuffer;
      segment.expandable = u64(dict, "is_expandable", where) != 0;
      segment.stack = stack(dict, where);
      if (const NodeId* blocks = find(dict, "blocks")) {
        const Node& block_list = expect_sequence(*blocks, where + " 'blocks'");
        segment.blocks.reserve(std::min<std::size_t>(block_list.items.size(), budget_));
        for (std::size_t b = 0; b < block_list.items.size(); ++b) {
          spend("blocks");
          segment.blocks.push_back(map_block(block_list.items[b], "block " + std::to_string(b) + " of " + where));
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

  Block map_block(NodeId id, const std::string& where) {
    const Node& dict = expect(id, Kind::dict, where);
    Block block;
    block.address = u64(dict, "address", where);
    block.size = u64(dict, "size", where);
    const std::string* state = text(dict, "state");
    if (state == nullptr) bad(where + " has no 'state'");
    if (*state == "active_allocated") block.state = BlockState::active_allocated;
    else if (*state == "active_pending_free") block.state = BlockState::active_pending_free;
    else if (*state == "inactive") block.state = BlockState::inactive;
    else bad(where + " has unknown state '" + state->substr(0, 64) + "'");
    // PyTorch leaves the last request's size on a cached block; the model
    // says requested is 0 when inactive.
    block.requested = block.state == BlockState::inactive ? 0 : u64(dict, "requested_size", where);
    block.stack = stack(dict, where);
    return block;
  }

  // The model promises blocks inside their segment and apart; the analyzer
  // relies on it, so a file that breaks it is rejected here.
  static void check_blocks(const Segment& segment, const std::string& where) {
    std::uint64_t cursor = segment.address;
    const std::uint64_t end = segment.address + segment.total_size;
    if (end < segment.address) bad(where + " wraps around the address space");
    for (const Block& block : segment.blocks) {
      if (block.address < cursor || block.size > end - block.address || block.address > end) {
        bad(where + " has a block at " + std::to_string(block.address) + " that overlaps another or leaves the segment");
      }
      cursor = block.address + block.size;
    }
  }

  // --- traces -------------------------------------------------------------

  std::vector<std::vector<Event>> map_traces(NodeId id) {
    const Node& devices = expect_sequence(id, "'device_traces'");
    std::vector<std::vector<Event>> per_device(devices.items.size());
    if (devices.items.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) bad("too many devices");
    for (std::size_t d = 0; d < devices.items.size(); ++d) {
      const Node& trace = expect_sequence(devices.items[d], "device_traces[" + std::to_string(d) + "]");
      per_device[d].reserve(std::min<std::size_t>(trace.items.size(), budget_));
      for (std::size_t i = 0; i < trace.items.size(); ++i) {
        spend("events");
        const std::string where = "device_traces[" + std::to_string(d) + "][" + std::to_string(i) + "]";
        if (auto event = map_event(trace.items[i], static_cast<std::int32_t>(d), where)) per_device[d].push_back(*event);
      }
    }
    return per_device;
  }

  std::uint64_t time_ns(const Node& dict, const std::string& where) const {
    const std::uint64_t us = u64(dict, "time_us", where);
    if (us > std::numeric_limits<std::uint64_t>::max() / 1000) bad(where + " has time_us out of range");
    return us * 1000;
  }

  std::optional<Event> map_event(NodeId id, std::int32_t device, const std::string& where) {
    const Node& dict = expect(id, Kind::dict, where);
    const std::string* action = text(dict, "action");
    if (action == nullptr) bad(where + " has no 'action'");
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
    event.time_ns = time_ns(dict, where);
    event.stream = u64(dict, "stream", where, true);
    event.stack = stack(dict, where);
    const std::uint64_t size = u64(dict, "size", where);
    if (event.kind == EventKind::oom) {
      event.address = find(dict, "device_free") != nullptr ? u64(dict, "device_free", where)
                                                                          : u64(dict, "addr", where);
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

  std::vector<Event> map_annotations(NodeId id) {
    std::vector<Event> out;
    const Node& list = tree_[id];
    if (list.kind != Kind::list && list.kind != Kind::tuple) return out;
    out.reserve(std::min<std::size_t>(list.items.size(), budget_));
    for (std::size_t i = 0; i < list.items.size(); ++i) {
      spend("annotations");
      const std::string where = "external_annotations[" + std::to_string(i) + "]";
      const Node& dict = expect(list.items[i], Kind::dict, where);
      const std::string* stage = text(dict, "stage");
      Event event;
      if (stage != nullptr && *stage == "START") event.kind = EventKind::annotation_begin;
      else if (stage != nullptr && *stage == "END") event.kind = EventKind::annotation_end;
      else {
        ++skipped_records_;
        continue;
      }
      event.device = device_index(dict, where);
      event.time_ns = time_ns(dict, where);
      event.aux = intern_node(dict, "name").value;
      out.push_back(event);
    }
    return out;
  }

  // --- block sizes ----------------------------------------------------------

  // PyTorch's trace records requested bytes; the model wants the block size.
  // In order of trust: the final layout's block for an allocation still alive
  // at dump time; the whole fresh segment when PyTorch would not split it;
  // round_size() otherwise. Frees carry the size of their allocation.
  void infer_block_sizes(std::vector<Event>& events, const std::vector<const Segment*>& segments) {
    std::unordered_map<std::uint64_t, const Block*> final_blocks;
    std::unordered_map<std::uint64_t, const Segment*> final_segments;
    for (const Segment* segment_pointer : segments) {
      const Segment& segment = *segment_pointer;
      final_segments.emplace(segment.address, &segment);
      for (const Block& block : segment.blocks) {
        if (block.state != BlockState::inactive && block.state != BlockState::unmapped)
          final_blocks.emplace(block.address, &block);
      }
    }
    // Forward: the rounding rules, and segment flags.
    for (std::size_t i = 0; i < events.size(); ++i) {
      Event& event = events[i];
      if (event.kind == EventKind::segment_alloc) {
        const auto found = final_segments.find(event.address);
        const bool large = found != final_segments.end() && found->second->total_size == event.size
                               ? found->second->large_pool
                               : event.size > kSmallBuffer;
        event.aux = large ? std::uint64_t{segment_flag_large_pool} : std::uint64_t{0};
      }
      if (event.kind != EventKind::alloc) continue;
      event.size = detail::pytorch_round_size(event.aux, divisions_);
      if (i > 0 && events[i - 1].kind == EventKind::segment_alloc && events[i - 1].address == event.address &&
          events[i - 1].size >= event.size) {
        const std::uint64_t remaining = events[i - 1].size - event.size;
        const bool small = event.size <= kSmallSize;
        const bool split = small ? remaining >= kMinBlockSize : event.size < max_split_size_ && remaining > kSmallSize;
        if (!split) event.size = events[i - 1].size;
      }
    }
    // Backward: allocations never freed in the trace are the final blocks.
    std::unordered_set<std::uint64_t> freed_later;
    for (std::size_t i = events.size(); i-- > 0;) {
      Event& event = events[i];
      if (event.kind == EventKind::free_completed) freed_later.insert(event.address);
      if (event.kind != EventKind::alloc) continue;
      if (freed_later.insert(event.address).second) {  // the last alloc at this address, still alive
        const auto found = final_blocks.find(event.address);
        if (found != final_blocks.end() && found->second->requested == event.aux) event.size = found->second->size;
      }
    }
    // Forward: frees take their allocation's size; a free of a block the
    // trace never allocated means the trace does not start at the beginning.
    std::unordered_map<std::uint64_t, std::uint64_t> live;  // address -> block size
    std::unordered_set<std::uint64_t> segments_seen;
    bool begins_mid_run = false;
    for (Event& event : events) {
      switch (event.kind) {
        case EventKind::alloc: live[event.address] = event.size; break;
        case EventKind::free_requested:
        case EventKind::free_completed: {
          const auto found = live.find(event.address);
          if (found != live.end()) {
            event.size = found->second;
            if (event.kind == EventKind::free_completed) live.erase(found);
          } else {
            begins_mid_run = true;
            const auto final_block = final_blocks.find(event.address);
            event.size = final_block != final_blocks.end() && final_block->second->requested == event.aux
                             ? final_block->second->size
                             : detail::pytorch_round_size(event.aux, divisions_);
            if (event.kind == EventKind::free_requested) live[event.address] = event.size;
          }
          break;
        }
        case EventKind::segment_alloc: segments_seen.insert(event.address); break;
        case EventKind::segment_release:
          if (!segments_seen.erase(event.address)) begins_mid_run = true;
          break;
        default: break;
      }
    }
    if (begins_mid_run) out_.settings["trace_may_begin_mid_run"] = "true";
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
    std::size_t total = 0;
    for (const auto* sequence : sequences) total += sequence->size();
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

  void fill_devices(const std::vector<std::vector<Event>>& per_device) {
    std::set<std::int32_t> used;
    for (const Segment& segment : out_.segments) used.insert(segment.device);
    for (std::size_t d = 0; d < per_device.size(); ++d) {
      if (!per_device[d].empty()) used.insert(static_cast<std::int32_t>(d));
    }
    for (const std::int32_t index : used) {
      DeviceInfo info;
      info.index = index;  // PyTorch's snapshot names no device and no capacity
      out_.devices.push_back(info);
    }
  }

  const Tree& tree_;
  std::size_t budget_;
  Snapshot out_;
  std::array<std::uint64_t, 16> divisions_{};
  std::uint64_t max_split_size_ = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t skipped_records_ = 0;
  mutable std::unordered_map<const Node*, std::unordered_map<std::string_view, const NodeId*>> dict_index_;
  std::unordered_map<std::string, std::uint32_t> string_ids_;
  std::unordered_map<NodeId, StringId> string_by_node_;
  std::unordered_map<NodeId, FrameId> frame_by_node_;
  std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, std::uint32_t> frame_ids_;
  std::unordered_map<NodeId, StackId> stack_by_node_;
  std::map<std::vector<std::uint32_t>, std::uint32_t> stack_ids_;
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
  const pickle::Tree tree = pickle::parse(bytes);
  return Mapper(tree, bytes.size()).run();
}

Snapshot read_pytorch_pickle(const std::filesystem::path& path) {
  return decode_pytorch_pickle(pickle_file::read_all(path, "PyTorch snapshot"));
}

}  // namespace cachealloc::snapshot
