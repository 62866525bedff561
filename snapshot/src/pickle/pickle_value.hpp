// The value tree of the restricted unpickler (unpickler.hpp) that the
// mapper (pickle_mapper.cpp) turns into a Snapshot.
//
// Compact by design: a 3M-entry PyTorch trace is ~200 MB of pickle, and one
// heap node per value made the tree 20x the file. Here
//   - a value is 16 bytes (Value); text and bytes are views into the input,
//     which must outlive the tree;
//   - a list, tuple or dict is a 16-byte Container, referred to by id: the
//     memo holds ids (BINGET pushes an id, never a copy), cycles are
//     harmless and nothing is destroyed recursively;
//   - items live in one arena (slices with power-of-two capacity, so
//     appending is amortized O(1) however containers interleave);
//   - two shapes PyTorch repeats millions of times are stored in a form of
//     their own, with the same meaning:
//       * a list of dicts (a 'frames' list) is a FrameList: the sequence of
//         dict ids, deduplicated, so a stack repeated a million times is kept
//         once and the mapper interns it once;
//       * a dict whose keys are all trace-entry keys ('action' with a known
//         action, 'addr', 'size', 'stream', 'time_us', 'frames',
//         'device_free', 'compile_context', 'user_metadata') is a
//         TraceEntry: its fields packed into an Event-sized record
//         (trace_schema.hpp), so the trace can become the model's events in
//         place.
//         'compile_context' and 'user_metadata' keep only their presence: no
//         mapping reads them (a TraceEntry iterated as a dict shows them as None).
//       * a list of consecutive TraceEntries (a device's trace) is a
//         TraceRun: two numbers, however long the trace.
//     Changing such a container later (a second batch of SETITEMS with
//     other keys, an APPEND to a frame list) turns it back into plain items
//     first, so what the mapper sees is what Python would build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cachealloc/snapshot/model.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "trace_schema.hpp"

namespace cachealloc::snapshot::pickle {

enum class Kind : std::uint8_t { none, boolean, integer, floating, text, bytes, list, tuple, dict };
const char* to_string(Kind kind) noexcept;

using ContainerId = std::uint32_t;

// A Python value. Integers past 64 bits keep only `too_big`: no field of a
// memory snapshot needs them, but a reader must still parse past them.
struct Value {
  Kind kind = Kind::none;
  bool flag = false;      // boolean: its value; integer: negative
  bool too_big = false;   // integer: does not fit in 64 bits
  std::uint32_t length = 0;  // text, bytes: byte length; list, tuple, dict: ContainerId
  union {
    std::uint64_t magnitude = 0;  // integer (and boolean: 0 or 1)
    double number;                // floating
    const char* text;             // text (UTF-8 as stored), bytes
  };

  bool is_container() const noexcept { return kind == Kind::list || kind == Kind::tuple || kind == Kind::dict; }
  ContainerId container() const noexcept { return length; }
  std::string_view view() const noexcept { return {text, length}; }
};
static_assert(sizeof(Value) == 16);

enum class Shape : std::uint8_t { items, frame_list, trace_entry, trace_run };

struct Container {
  Kind kind = Kind::list;
  Shape shape = Shape::items;
  // items: values (a dict: keys and values interleaved, in insertion order;
  // a repeated key: the last one wins, as in Python); frame_list: dicts.
  std::uint32_t size = 0;
  // items: arena offset; frame_list: FrameList number; trace_entry: index in
  // Tree::traces; trace_run: the index of the first of `size` consecutive
  // TraceEntries in Tree::traces (a device's trace, as PyTorch writes it)
  std::uint64_t offset = 0;
};
static_assert(sizeof(Container) == 16);

// The dict and the frames list of a trace entry read whole
// (pickle_entry.hpp) have no Container stored: their ids name them by the
// entry's index i in Tree::traces, kWholeEntryDict | i and
// kWholeEntryFrames | i, and Tree::container() makes their Container from
// the index and Tree::entry_frames. That is 32 bytes an entry less to fault
// in and zero (96 MB for a 3M-entry trace) for 4 bytes of entry_frames.
// Stored containers have ids below kWholeEntryDict.
inline constexpr ContainerId kWholeEntryDict = ContainerId{1} << 29;
inline constexpr ContainerId kWholeEntryFrames = kWholeEntryDict | (ContainerId{1} << 28);
inline constexpr ContainerId kWholeEntryIndexMask = (ContainerId{1} << 28) - 1;

struct FrameList {
  std::uint64_t offset = 0;  // into Tree::frame_items
  std::uint32_t size = 0;
};

struct Tree {
  Value root;
  std::vector<Container> containers;  // ids below kWholeEntryDict
  // Per record of `traces`: the FrameList number + 1 of its whole entry's
  // frames list (kWholeEntryFrames), 0 for an empty one or none.
  std::vector<std::uint32_t> entry_frames;
  // Whole-entry containers changed after they were read (a hand-made pickle
  // only: an APPEND to a frames list, more SETITEMS on an entry): their
  // Container from then on.
  std::unordered_map<ContainerId, Container> changed;
  std::vector<Value> arena;
  std::vector<FrameList> frame_lists;
  std::vector<ContainerId> frame_items;
  std::vector<Event> traces;
  // A TraceEntry turned back into items: its record in `traces` is stale, so
  // the trace cannot become the events in place.
  bool trace_entry_detached = false;

  // The Container of `id`, stored or made (see kWholeEntryDict).
  // Inline (GCC kept it out of line: 3% of summary's instructions).
  [[gnu::always_inline]] Container container(ContainerId id) const noexcept {
    if (id < kWholeEntryDict) [[likely]]
      return containers[id];
    if (!changed.empty()) return changed_container(id);
    const std::uint32_t index = id & kWholeEntryIndexMask;
    if ((id & kWholeEntryFrames) != kWholeEntryFrames) return Container{Kind::dict, Shape::trace_entry, 0, index};
    const std::uint32_t list = entry_frames[index];
    if (list == 0) return Container{Kind::list, Shape::items, 0, 0};
    return Container{Kind::list, Shape::frame_list, frame_lists[list - 1].size, list - 1};
  }
  Container changed_container(ContainerId id) const noexcept;

  std::size_t size(ContainerId id) const noexcept;  // a dict: twice its entries
  Value item(ContainerId id, std::size_t index) const noexcept;
  // The value of `key` in a dict (last one wins), nullopt when absent. Linear
  // in the dict's size; the mapper indexes big dicts itself.
  std::optional<Value> find(ContainerId dict, std::string_view key) const noexcept;
  // A TraceEntry's field as the dict would hold it; nullopt when absent.
  std::optional<Value> trace_value(const Event& entry, TraceField field) const noexcept;
};

using ParseOptions = detail::PickleReadOptions;

// Parses a pickle of protocol 2 to 5. Throws SnapshotError (see pickle.hpp).
// The tree points into `bytes`.
Tree parse(std::span<const std::byte> bytes, const ParseOptions& options = {});

}  // namespace cachealloc::snapshot::pickle
