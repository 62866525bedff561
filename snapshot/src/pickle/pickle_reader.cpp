// The restricted unpickler: a stack machine over the opcodes that build plain
// data. See pickle.hpp for what it accepts and what it costs.
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cstring>
#include <string.h>  // memmem
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <new>
#include <type_traits>
#include <unordered_map>

#include "cachealloc/snapshot/format.hpp"
#include "parallel.hpp"
#include "pickle_entry.hpp"
#include "pickle_value.hpp"

namespace cachealloc::snapshot::pickle {

namespace {

// Values waiting on the stack. PyTorch's pickles never hold more than a few
// thousand (the pickler batches APPENDS/SETITEMS by 1000 and the schema is
// about 7 levels deep); the cap turns a file of 100k nested lists into an
// error instead of a large stack.
constexpr std::size_t kMaxStack = 1u << 16;
// Open MARKs: nesting of (  ... LIST/DICT/TUPLE/APPENDS/SETITEMS.
constexpr std::size_t kMaxMarks = 1000;

// The one empty tuple every EMPTY_TUPLE pushes: tuples are immutable.
constexpr ContainerId kEmptyTuple = 0;
// The memo grows by this many entries (1 MiB) within the room reserved.
constexpr std::size_t kMemoStep = std::size_t{1} << 18;
// Container ids and boxed scalars fit in the 30 bits of a MemoEntry.
constexpr std::size_t kMaxContainers = (std::size_t{1} << 30) - 1;
// Stored containers' ids stay below the whole entries' (pickle_value.hpp).
constexpr std::size_t kMaxStoredContainers = kWholeEntryDict - 1;
// A list of more dicts than this stays plain items: frame lists are short,
// and a long list of dicts (a trace, the segments) is read once anyway.
constexpr std::size_t kMaxFrameList = 4096;

struct OpcodeInfo {
  const char* name;
  bool executes;  // imports or calls something: never allowed
};

// Every opcode of protocols 0 to 5, so each rejection can name its opcode.
OpcodeInfo describe(std::uint8_t op) noexcept {
  switch (op) {
    case 0x28: return {"MARK", false};
    case 0x2e: return {"STOP", false};
    case 0x30: return {"POP", false};
    case 0x31: return {"POP_MARK", false};
    case 0x32: return {"DUP", false};
    case 0x46: return {"FLOAT", false};
    case 0x49: return {"INT", false};
    case 0x4a: return {"BININT", false};
    case 0x4b: return {"BININT1", false};
    case 0x4c: return {"LONG", false};
    case 0x4d: return {"BININT2", false};
    case 0x4e: return {"NONE", false};
    case 0x50: return {"PERSID", true};
    case 0x51: return {"BINPERSID", true};
    case 0x52: return {"REDUCE", true};
    case 0x53: return {"STRING", false};
    case 0x54: return {"BINSTRING", false};
    case 0x55: return {"SHORT_BINSTRING", false};
    case 0x56: return {"UNICODE", false};
    case 0x58: return {"BINUNICODE", false};
    case 0x61: return {"APPEND", false};
    case 0x62: return {"BUILD", true};
    case 0x63: return {"GLOBAL", true};
    case 0x64: return {"DICT", false};
    case 0x7d: return {"EMPTY_DICT", false};
    case 0x65: return {"APPENDS", false};
    case 0x67: return {"GET", false};
    case 0x68: return {"BINGET", false};
    case 0x69: return {"INST", true};
    case 0x6a: return {"LONG_BINGET", false};
    case 0x6c: return {"LIST", false};
    case 0x5d: return {"EMPTY_LIST", false};
    case 0x6f: return {"OBJ", true};
    case 0x70: return {"PUT", false};
    case 0x71: return {"BINPUT", false};
    case 0x72: return {"LONG_BINPUT", false};
    case 0x73: return {"SETITEM", false};
    case 0x74: return {"TUPLE", false};
    case 0x29: return {"EMPTY_TUPLE", false};
    case 0x75: return {"SETITEMS", false};
    case 0x47: return {"BINFLOAT", false};
    case 0x80: return {"PROTO", false};
    case 0x81: return {"NEWOBJ", true};
    case 0x82: return {"EXT1", true};
    case 0x83: return {"EXT2", true};
    case 0x84: return {"EXT4", true};
    case 0x85: return {"TUPLE1", false};
    case 0x86: return {"TUPLE2", false};
    case 0x87: return {"TUPLE3", false};
    case 0x88: return {"NEWTRUE", false};
    case 0x89: return {"NEWFALSE", false};
    case 0x8a: return {"LONG1", false};
    case 0x8b: return {"LONG4", false};
    case 0x42: return {"BINBYTES", false};
    case 0x43: return {"SHORT_BINBYTES", false};
    case 0x8c: return {"SHORT_BINUNICODE", false};
    case 0x8d: return {"BINUNICODE8", false};
    case 0x8e: return {"BINBYTES8", false};
    case 0x8f: return {"EMPTY_SET", false};
    case 0x90: return {"ADDITEMS", false};
    case 0x91: return {"FROZENSET", false};
    case 0x92: return {"NEWOBJ_EX", true};
    case 0x93: return {"STACK_GLOBAL", true};
    case 0x94: return {"MEMOIZE", false};
    case 0x95: return {"FRAME", false};
    case 0x96: return {"BYTEARRAY8", false};
    case 0x97: return {"NEXT_BUFFER", false};
    case 0x98: return {"READONLY_BUFFER", false};
    default: return {nullptr, false};
  }
}

std::string hex_byte(std::uint8_t value) {
  std::array<char, 8> text{};
  std::snprintf(text.data(), text.size(), "0x%02x", static_cast<unsigned>(value));
  return text.data();
}

}  // namespace

int trace_key_of(std::string_view key) noexcept {
  switch (key.size()) {
    case 4:
      if (key == "addr") return static_cast<int>(TraceField::addr);
      if (key == "size") return static_cast<int>(TraceField::size);
      return kNotATraceKey;
    case 6:
      if (key == "action") return kActionKey;
      if (key == "stream") return static_cast<int>(TraceField::stream);
      if (key == "frames") return static_cast<int>(TraceField::frames);
      return kNotATraceKey;
    case 7: return key == "time_us" ? static_cast<int>(TraceField::time_us) : kNotATraceKey;
    case 11: return key == "device_free" ? static_cast<int>(TraceField::device_free) : kNotATraceKey;
    case 13: return key == "user_metadata" ? static_cast<int>(TraceField::user_metadata) : kNotATraceKey;
    case 15: return key == "compile_context" ? static_cast<int>(TraceField::compile_context) : kNotATraceKey;
    default: return kNotATraceKey;
  }
}

constexpr std::array<EventKind, 9> kTraceActions = {
    EventKind::alloc,          EventKind::free_requested, EventKind::free_completed,
    EventKind::segment_alloc,  EventKind::segment_release, EventKind::segment_map,
    EventKind::segment_unmap,  EventKind::snapshot,       EventKind::oom};

std::optional<EventKind> trace_action_of(std::string_view name) noexcept {
  for (const EventKind kind : kTraceActions) {
    if (trace_action_name(kind) == name) return kind;
  }
  return std::nullopt;
}

namespace {

std::uint64_t trace_slot(const Event& entry, TraceField field) noexcept {
  return trace_slot(const_cast<Event&>(entry), field);
}


// What a text value means to a trace entry, as a key (a TraceField,
// kActionKey or kNotATraceKey) and as an action (an EventKind, or -1).
struct TraceMeaning {
  const char* text = nullptr;
  std::uint32_t length = 0;
  std::int8_t key = kNotATraceKey;
  std::int8_t action = -1;
};

// The value stack: raw storage that doubles from kInitialStack values up to
// kMaxStack, so a push is a compare, a store and an increment. It used to be
// one block of kMaxStack values (1 MiB) per reader: an mmap and munmap per
// read in a plain build, and under ASan 2 x 128 KiB of shadow written per read
// (poisoned on allocation and on free): a 773-byte pickle read 2000 times by
// fuzz_pickle_reader took 2.17 s of CPU, now 1.58 s. PyTorch's pickles reach
// about a thousand values (pickle batches 1000 items per APPENDS or
// SETITEMS): three doublings. Value is trivially copyable and destructible,
// so growing is a memcpy and a push's assignment is all an element needs.
class ValueStack {
 public:
  static_assert(std::is_trivially_copyable_v<Value> && std::is_trivially_destructible_v<Value>);
  static constexpr std::size_t kInitialStack = 256;
  ValueStack() : values_(allocate(kInitialStack)), capacity_(kInitialStack) {}
  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return capacity_; }
  bool empty() const noexcept { return size_ == 0; }
  Value* data() noexcept { return values_.get(); }
  Value& back() noexcept { return values_.get()[size_ - 1]; }
  Value& operator[](std::size_t index) noexcept { return values_.get()[index]; }
  // Only below capacity(): the caller grows first (grow()).
  void push_back(const Value& value) noexcept { values_.get()[size_++] = value; }
  void pop_back() noexcept { --size_; }
  void resize(std::size_t smaller) noexcept { size_ = smaller; }
  // Doubles the room, to kMaxStack at most; moves data().
  void grow() {
    const std::size_t larger = std::min(capacity_ * 2, kMaxStack);
    Storage bigger(allocate(larger));
    std::memcpy(static_cast<void*>(bigger.get()), values_.get(), size_ * sizeof(Value));
    values_ = std::move(bigger);
    capacity_ = larger;
  }

 private:
  struct Release {
    void operator()(Value* values) const noexcept { ::operator delete[](values); }
  };
  using Storage = std::unique_ptr<Value, Release>;
  static Value* allocate(std::size_t count) { return static_cast<Value*>(::operator new[](count * sizeof(Value))); }
  Storage values_;
  std::size_t capacity_ = 0;
  std::size_t size_ = 0;
};

// Thrown when a parallel read meets something only the one-by-one reader
// may decide (a memo reference of the wrong kind, a run of trace entries
// that does not join up); parse() then reads the whole pickle on one thread.
struct ParallelReadAbandoned {};

// Inputs from which the tree's big arrays ask for huge pages.
constexpr std::size_t kHugePagesFrom = std::size_t{32} << 20;

// Whether a text equals the last one boxed: PyTorch memoizes a fresh 'N/A'
// in every trace entry, and equal scalars in a row share one box. Inline,
// since it runs per entry; the texts are a few bytes.
bool same_text(const char* last, std::uint32_t last_length, const char* text, std::uint32_t length) noexcept {
  if (last == nullptr || last_length != length) return false;
  for (std::uint32_t i = 0; i < length; ++i) {
    if (last[i] != text[i]) return false;
  }
  return true;
}

// Where one chunk's entries go in the tree: after those of the chunks
// before it.
struct ChunkBase {
  std::size_t containers = 0;
  std::size_t records = 0;
  std::size_t memo = 0;
  std::size_t boxes = 0;
  std::vector<std::uint64_t> frame_lists;  // the chunk's FrameList numbers -> the tree's
};

// The tree's arrays, as chunk writers fill them side by side: each writes
// only its own slots, sized before any starts.
struct TreeSlots {
  Container* containers = nullptr;
  Event* records = nullptr;
  std::uint32_t* entry_frames = nullptr;
  MemoEntry* memo = nullptr;
  Value* boxed = nullptr;
};

// One thread's share of a long trace list: the bytes [begin, stop), taking
// only whole entries, MARK, APPENDS and FRAME; reading stops at anything
// else, or at the first opcode boundary at or past stop. Read twice: count()
// learns how many containers, records, memo entries and boxes the chunk
// adds (and interns its frame lists), so every chunk's place in the tree is
// known; write() then reads it again straight into those places. Reading
// twice costs less than faulting in and copying a second set of arrays.
struct ChunkReader {
  std::size_t begin = 0;
  std::size_t stop = 0;
  std::size_t end = 0;  // where reading stopped
  bool failed = false;  // an exception left the chunk half read
  // Batches (MARK entries... APPENDS): whether the chunk ends inside one,
  // and how many of its entries come after its last APPENDS.
  bool open_at_end = true;
  bool has_appends = false;
  std::size_t entries_after_appends = 0;
  // What count() found; write() must find the same.
  std::size_t records = 0;
  std::size_t memo = 0;
  std::size_t boxes = 0;
  std::vector<FrameList> frame_lists;  // the chunk's numbers, frame dicts by the tree's ids
  std::vector<ContainerId> frame_items;
  FrameListTable frame_table;
  // References into earlier chunks' memo entries, followed once all are written.
  struct Fixup {
    std::size_t record;
    DeferredRef ref;
  };
  std::vector<Fixup> fixups;

  // Walks the chunk, calling on_entry(entry) for each whole entry; returns
  // where it stopped.
  template <class OnEntry>
  std::size_t walk(const std::uint8_t* data, std::size_t size, const MemoView& memo_view, OnEntry&& on_entry) {
    EntryScanner scanner;
    ScannedEntry entry;
    std::size_t at = begin;
    bool open = true;          // every chunk starts inside a batch
    std::size_t in_batch = 0;  // entries since the batch's MARK, as far as this chunk saw
    has_appends = false;
    entries_after_appends = 0;
    while (at < stop && at < size) {
      const std::uint8_t op = data[at];
      if (op == 0x7d) {  // EMPTY_DICT: a trace entry, whole, or stop
        std::size_t next = at + 1;
        if (!open || !scanner.scan(data, next, size, memo_view, true, entry)) break;
        on_entry(entry);
        ++in_batch;
        ++entries_after_appends;
        at = next;
      } else if (op == 0x65) {  // APPENDS
        if (!open || in_batch == 0) break;
        open = false;
        has_appends = true;
        entries_after_appends = 0;
        ++at;
      } else if (op == 0x28) {  // MARK
        if (open) break;
        open = true;
        in_batch = 0;
        ++at;
      } else if (op == 0x95) {  // FRAME
        if (size - at < 9) break;
        std::uint64_t length = 0;
        std::memcpy(&length, data + at + 1, 8);
        if (length > size - at - 9) break;
        at += 9;
      } else {
        break;
      }
    }
    open_at_end = open;
    return at;
  }

  std::uint64_t intern(const ScannedEntry& entry) {
    return frame_table.intern(std::span<const ContainerId>(entry.frames, entry.frame_count), frame_lists, frame_items);
  }

  void count(const std::uint8_t* data, std::size_t size, const MemoView& memo_view) {
    const char* last_text = nullptr;  // box_text()'s test, within the chunk
    std::uint32_t last_length = 0;
    end = walk(data, size, memo_view, [&](const ScannedEntry& entry) {
      ++records;  // its dict and frames list are not stored (kWholeEntryDict)
      memo += entry.memoized_count;
      for (std::size_t i = 0; i < entry.memoized_count; ++i) {
        if (entry.memoized[i] == ScannedEntry::Memoized::frames) {
          if (entry.frame_count != 0) intern(entry);
        } else if (entry.memoized[i] == ScannedEntry::Memoized::text) {
          if (!same_text(last_text, last_length, entry.text[i], entry.text_length[i])) {
            ++boxes;
            last_text = entry.text[i];
            last_length = entry.text_length[i];
          }
        }
      }
    });
  }

  // Returns false when the second reading differs from the first (it cannot,
  // short of a bug: the bytes are the same).
  bool write(const std::uint8_t* data, std::size_t size, const MemoView& memo_view, const ChunkBase& base,
             const TreeSlots& tree) {
    std::size_t record_index = base.records;
    std::size_t memo_index = base.memo;
    std::size_t box = base.boxes;
    const char* last_text = nullptr;
    std::uint32_t last_length = 0;
    bool same = true;
    const std::size_t stopped = walk(data, size, memo_view, [&](const ScannedEntry& entry) {
      if (record_index == base.records + records) {
        same = false;
        return;
      }
      const std::size_t memo_start = memo_index;
      const auto entry_index = static_cast<ContainerId>(record_index);
      const ContainerId dict = kWholeEntryDict | entry_index;
      Event record = entry.record;
      tree.entry_frames[record_index] = 0;
      for (std::size_t i = 0; i < entry.memoized_count; ++i) {
        MemoEntry stored = 0;
        switch (entry.memoized[i]) {
          case ScannedEntry::Memoized::dict: stored = (memo_kind_bits(Kind::dict) << kMemoKindShift) | dict; break;
          case ScannedEntry::Memoized::text:
            if (!same_text(last_text, last_length, entry.text[i], entry.text_length[i])) {
              Value value;
              value.kind = Kind::text;
              value.text = entry.text[i];
              value.length = entry.text_length[i];
              tree.boxed[box++] = value;
              last_text = entry.text[i];
              last_length = entry.text_length[i];
            }
            stored = static_cast<MemoEntry>(box - 1);
            break;
          case ScannedEntry::Memoized::frames: {
            const ContainerId list = kWholeEntryFrames | entry_index;
            if (entry.frame_count != 0) {
              tree.entry_frames[record_index] = static_cast<std::uint32_t>(base.frame_lists[intern(entry)] + 1);
            }
            record.thread = list;
            stored = (memo_kind_bits(Kind::list) << kMemoKindShift) | list;
            break;
          }
        }
        tree.memo[memo_index++] = stored;
      }
      record.stack = StackId{dict};
      // References past the memo as the chunks started: into this chunk's
      // own entries, follow them now; into an earlier chunk's, after all
      // chunks are written.
      for (std::size_t i = 0; i < entry.deferred_count; ++i) {
        const DeferredRef& ref = entry.deferred[i];
        if (ref.index >= memo_start + ref.memoized_before) {
          same = false;  // never stored by then: the one-by-one reader says what is wrong
        } else if (ref.index < base.memo) {
          fixups.push_back(Fixup{record_index, ref});
        } else if (!follow(ref, tree.memo[ref.index], tree.boxed, record)) {
          same = false;
        }
      }
      tree.records[record_index++] = record;
    });
    return same && stopped == end && record_index == base.records + records &&
           memo_index == base.memo + memo && box == base.boxes + boxes;
  }

  // What a deferred reference means to its record; false when the one-by-one
  // reader would not have made the dict a TraceEntry.
  static bool follow(const DeferredRef& ref, MemoEntry entry, const Value* boxed, Event& record) {
    switch (ref.use) {
      case DeferredRef::Use::action: {
        if ((entry >> kMemoKindShift) != 0 || boxed[entry].kind != Kind::text) return false;
        const std::optional<EventKind> action = trace_action_of(boxed[entry].view());
        if (!action) return false;
        record.kind = *action;
        return true;
      }
      case DeferredRef::Use::frames: {
        const Kind kind = memo_kind(entry);
        if (kind != Kind::list && kind != Kind::tuple) return false;
        record.thread = entry & kMemoIndexMask;
        return true;
      }
      case DeferredRef::Use::any: return true;
    }
    return false;
  }
};

class Unpickler {
 public:
  Unpickler(std::span<const std::byte> bytes, const ParseOptions& options) : bytes_(bytes), options_(options) {
    tree_.containers.push_back(Container{Kind::tuple, Shape::items, 0, 0});  // kEmptyTuple
    // Room, in address space only, for what a PyTorch pickle of this size
    // holds (a trace entry is ~60 bytes with its record and three memo
    // entries; its dict and frame list are stored only when read one opcode
    // at a time), so nothing big is copied while it grows.
    tree_.traces.reserve(bytes.size() / 48);
    tree_.entry_frames.reserve(bytes.size() / 48);
    tree_.containers.reserve(bytes.size() / 24);
    memo_.reserve(bytes.size() / 16);
    // Faulting in those hundreds of MB 4 KiB at a time was a third of the
    // time to read a 190 MB trace on the H200 host (~2 us a page); with
    // transparent huge pages on request (the usual 'madvise' setting) they
    // come 2 MiB at a time. A hint: refused, nothing changes. (One VM seen
    // here backs a guest's first huge pages slowly; once, not per run.)
    if (bytes.size() >= kHugePagesFrom) {
      detail::advise_huge_pages(tree_.traces.data(), tree_.traces.capacity() * sizeof(Event));
      detail::advise_huge_pages(tree_.entry_frames.data(), tree_.entry_frames.capacity() * sizeof(std::uint32_t));
      detail::advise_huge_pages(tree_.containers.data(), tree_.containers.capacity() * sizeof(Container));
      detail::advise_huge_pages(memo_.data(), memo_.capacity() * sizeof(MemoEntry));
    }
  }

  Tree run() {
    if (bytes_.empty()) throw SnapshotError(ErrorCode::truncated, "truncated pickle: the input is empty");
    if (std::to_integer<std::uint8_t>(bytes_[0]) != 0x80 || bytes_.size() < 2) {
      if (bytes_.size() < 2 && std::to_integer<std::uint8_t>(bytes_[0]) == 0x80) {
        throw SnapshotError(ErrorCode::truncated, "truncated pickle: it ends inside the PROTO opcode");
      }
      throw SnapshotError(ErrorCode::not_a_snapshot,
                          "not a PyTorch memory snapshot: no pickle PROTO opcode (protocol 2 or later) at offset 0");
    }
    const auto protocol = std::to_integer<unsigned>(bytes_[1]);
    if (protocol > 5) {
      throw SnapshotError(ErrorCode::newer_version, "pickle protocol " + std::to_string(protocol) +
                                                        " is newer than the newest this reader knows (5)");
    }
    if (protocol < 2) {
      throw SnapshotError(ErrorCode::unsupported,
                          "pickle protocol " + std::to_string(protocol) + " is not supported (2 to 5 are)");
    }
    position_ = 2;
    while (!step()) {
    }
    return std::move(tree_);
  }

 private:
  // Returns true at STOP. The common opcodes come first in one switch; each
  // reads its argument with one bounds check.
  bool step() {
    op_offset_ = position_;
    op_ = read_u8();
    switch (op_) {
      case 0x68: memo_get(read_u8()); return false;                                       // BINGET
      case 0x94: memo_put(memo_count_); return false;                                     // MEMOIZE
      case 0x28:  // MARK
        if (marks_.size() >= kMaxMarks) {
          inconsistent("nesting deeper than " + std::to_string(kMaxMarks) + " MARKs");
        }
        marks_.push_back(stack_.size());
        // A new batch of a long trace list: the rest of it may be read by
        // several threads.
        if (op_offset_ == trace_batch_closed_at_ && op_offset_ >= next_parallel_at_ && options_.threads > 1 &&
            remaining() >= 2 * options_.min_chunk_bytes) {
          read_trace_in_parallel();
        }
        return false;
      case 0x8c: push_text(Kind::text, read_u8()); return false;     // SHORT_BINUNICODE
      case 0x4b: push_integer(false, read_u8()); return false;       // BININT1
      case 0x4d: push_integer(false, read_le<2>()); return false;      // BININT2
      case 0x4a: {                                                   // BININT
        const auto value = static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le<4>()));
        push_integer(value < 0, value < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(static_cast<std::int64_t>(value))
                                          : static_cast<std::uint64_t>(value));
        return false;
      }
      case 0x8a: long_integer(read_u8()); return false;              // LONG1
      case 0x6a: memo_get(static_cast<std::uint32_t>(read_le<4>())); return false;          // LONG_BINGET
      case 0x7d:  // EMPTY_DICT
        if (!read_trace_entry()) push_container(make_container(Kind::dict));
        return false;
      case 0x5d: push_container(make_container(Kind::list)); return false;                // EMPTY_LIST
      case 0x65: extend(Kind::list); return false;                                        // APPENDS
      case 0x75: extend(Kind::dict); return false;                                        // SETITEMS
      case 0x80: {  // PROTO inside the stream: allowed, must agree on the range
        const unsigned protocol = read_u8();
        if (protocol > 5) {
          throw SnapshotError(ErrorCode::newer_version, "pickle protocol " + std::to_string(protocol) +
                                                            " is newer than the newest this reader knows (5)");
        }
        return false;
      }
      case 0x95: {  // FRAME: a hint for buffered readers; the whole input is in memory
        const std::uint64_t length = read_le<8>();
        if (length > remaining()) truncated_length(length);
        return false;
      }
      case 0x2e: {  // STOP
        if (stack_.empty()) inconsistent("STOP with an empty stack");
        tree_.root = stack_.back();
        return true;
      }
      case 0x71: memo_put(read_u8()); return false;                                       // BINPUT
      case 0x72: memo_put(static_cast<std::uint32_t>(read_le<4>())); return false;          // LONG_BINPUT
      case 0x29: push_container(kEmptyTuple); return false;                               // EMPTY_TUPLE
      case 0x64: collect(Kind::dict); return false;                                       // DICT
      case 0x6c: collect(Kind::list); return false;                                       // LIST
      case 0x74: collect(Kind::tuple); return false;                                      // TUPLE
      case 0x85: small_tuple(1); return false;                                            // TUPLE1
      case 0x86: small_tuple(2); return false;                                            // TUPLE2
      case 0x87: small_tuple(3); return false;                                            // TUPLE3
      case 0x61: append(); return false;                                                  // APPEND
      case 0x73: set_item(); return false;                                                // SETITEM
      case 0x4e: push(Value{}); return false;                                             // NONE
      case 0x88: push_boolean(true); return false;                                        // NEWTRUE
      case 0x89: push_boolean(false); return false;                                       // NEWFALSE
      case 0x8b: {                                                                        // LONG4
        const auto length = static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le<4>()));
        if (length < 0) inconsistent("LONG4 declares a negative length");
        long_integer(static_cast<std::uint64_t>(length));
        return false;
      }
      case 0x47: {  // BINFLOAT: big-endian IEEE 754
        const std::byte* raw = take(8);
        std::uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | std::to_integer<std::uint64_t>(raw[i]);
        Value value;
        value.kind = Kind::floating;
        std::memcpy(&value.number, &bits, sizeof value.number);
        push(value);
        return false;
      }
      case 0x58: push_text(Kind::text, read_le<4>()); return false;    // BINUNICODE
      case 0x8d: push_text(Kind::text, read_le<8>()); return false;    // BINUNICODE8
      case 0x43: push_text(Kind::bytes, read_u8()); return false;    // SHORT_BINBYTES
      case 0x42: push_text(Kind::bytes, read_le<4>()); return false;   // BINBYTES
      case 0x8e: push_text(Kind::bytes, read_le<8>()); return false;   // BINBYTES8
      default: reject();
    }
  }

  [[noreturn]] void reject() const {
    const OpcodeInfo info = describe(op_);
    const std::string where = " at offset " + std::to_string(op_offset_);
    if (info.name == nullptr) {
      throw SnapshotError(ErrorCode::unsupported, "unknown pickle opcode " + hex_byte(op_) + where);
    }
    if (info.executes) {
      throw SnapshotError(ErrorCode::unsupported,
                          std::string("pickle opcode ") + info.name + " (" + hex_byte(op_) + ")" + where +
                              " would import or call code; a memory snapshot is plain data and this reader "
                              "never executes anything from the file");
    }
    throw SnapshotError(ErrorCode::unsupported, std::string("pickle opcode ") + info.name + " (" + hex_byte(op_) +
                                                    ")" + where + " is not supported by this reader");
  }

  [[noreturn]] void inconsistent(const std::string& what) const {
    const OpcodeInfo info = describe(op_);
    throw SnapshotError(ErrorCode::inconsistent, "bad pickle: " + what + " (" +
                                                     (info.name != nullptr ? info.name : "opcode") + " at offset " +
                                                     std::to_string(op_offset_) + ")");
  }

  [[noreturn]] void truncated_length(std::uint64_t wanted) const {
    const OpcodeInfo info = describe(op_);
    throw SnapshotError(ErrorCode::truncated,
                        std::string("truncated pickle: ") + (info.name != nullptr ? info.name : "opcode") +
                            " at offset " + std::to_string(op_offset_) + " needs " + std::to_string(wanted) +
                            " bytes but only " + std::to_string(remaining()) + " remain");
  }

  std::size_t remaining() const noexcept { return bytes_.size() - position_; }

  // The next `length` bytes, checked against the bytes left before anything
  // is allocated or read.
  // Error paths live out of line (gnu::cold) so the hot opcodes keep a
  // short prologue: a BINGET is about a dozen instructions.
  [[gnu::always_inline]] const std::byte* take(std::uint64_t length) {
    if (length > remaining()) [[unlikely]] past_end(length);
    const std::byte* out = bytes_.data() + position_;
    position_ += static_cast<std::size_t>(length);
    return out;
  }
  [[noreturn, gnu::cold, gnu::noinline]] void past_end(std::uint64_t length) const {
    if (position_ == op_offset_) {
      throw SnapshotError(ErrorCode::truncated, "truncated pickle: it ends at offset " + std::to_string(position_) +
                                                    " without a STOP opcode");
    }
    truncated_length(length);
  }
  [[gnu::always_inline]] std::uint8_t read_u8() { return std::to_integer<std::uint8_t>(*take(1)); }
  template <std::size_t Width>
  [[gnu::always_inline]] std::uint64_t read_le() {
    static_assert(std::endian::native == std::endian::little, "pickle integers are little-endian");
    const std::byte* raw = take(Width);
    std::uint64_t value = 0;
    std::memcpy(&value, raw, Width);
    return value;
  }

  // --- the stack ------------------------------------------------------------

  std::size_t floor() const noexcept { return marks_.empty() ? 0 : marks_.back(); }

  [[gnu::always_inline]] void push(const Value& value) {
    if (stack_.size() >= stack_.capacity()) [[unlikely]] grow_stack();
    stack_.push_back(value);
  }
  [[gnu::noinline]] void grow_stack() {
    if (stack_.capacity() >= kMaxStack) too_deep();
    stack_.grow();
  }
  [[noreturn, gnu::noinline]] void too_deep() const {
    inconsistent("nesting too deep: more than " + std::to_string(kMaxStack) + " values on the stack");
  }
  void push_container(ContainerId id) {
    Value value;
    value.kind = tree_.container(id).kind;
    value.length = id;
    push(value);
  }
  void push_boolean(bool flag) {
    Value value;
    value.kind = Kind::boolean;
    value.flag = flag;
    value.magnitude = flag ? 1 : 0;
    push(value);
  }
  [[noreturn, gnu::cold, gnu::noinline]] void stack_empty() const { inconsistent("the stack is empty"); }
  Value pop() {
    if (stack_.size() <= floor()) stack_empty();
    const Value value = stack_.back();
    stack_.pop_back();
    return value;
  }
  const Value& top() {
    if (stack_.size() <= floor()) stack_empty();
    return stack_.back();
  }
  std::size_t pop_mark() {
    if (marks_.empty()) inconsistent("no MARK to close");
    const std::size_t mark = marks_.back();
    marks_.pop_back();
    return mark;
  }

  // --- the memo -------------------------------------------------------------

  // Dense up to one entry per input byte (each PUT costs at least one byte,
  // so the memo stays linear in the input); a sparse index past that, which
  // only a hand-made pickle has, goes to a map.
  void memo_put(std::uint32_t index) {
    const Value& value = top();
    MemoEntry entry = 0;
    if (value.is_container()) [[likely]] {
      entry = (memo_kind_bits(value.kind) << kMemoKindShift) | value.container();
    } else {
      entry = box(value);
    }
    memo_store(index, entry);
  }
  void memo_store(std::uint32_t index, MemoEntry entry) {
    if (index != memo_count_) memo_dense_ = false;
    if (index < memo_.size()) [[likely]] {
      if (memo_[index] == kUnsetMemo) ++memo_count_;
      memo_[index] = entry;
      return;
    }
    memo_store_new(index, entry);
  }
  MemoEntry box(const Value& value) {
    MemoEntry entry = 0;
    {
      // PyTorch memoizes a fresh 'N/A' per trace entry: equal scalars in a
      // row share one box.
      const bool same = !boxed_.empty() && boxed_.back().kind == value.kind &&
                        boxed_.back().length == value.length && boxed_.back().flag == value.flag &&
                        boxed_.back().too_big == value.too_big &&
                        (value.kind == Kind::text || value.kind == Kind::bytes
                             ? std::memcmp(boxed_.back().text, value.text, value.length) == 0
                             : boxed_.back().magnitude == value.magnitude);
      if (!same) {
        if (boxed_.size() >= kMaxContainers) inconsistent("too many memoized values");
        boxed_.push_back(value);
      }
      entry = static_cast<MemoEntry>(boxed_.size() - 1);
    }
    return entry;
  }
  // box() of a text, with the check against the last box inline: PyTorch
  // memoizes a fresh 'N/A' in every trace entry.
  MemoEntry box_text(const char* text, std::uint32_t length) {
    if (!boxed_.empty() && boxed_.back().kind == Kind::text &&
        same_text(boxed_.back().text, boxed_.back().length, text, length)) {
      return static_cast<MemoEntry>(boxed_.size() - 1);
    }
    Value value;
    value.kind = Kind::text;
    value.text = text;
    value.length = length;
    return box(value);
  }
  [[gnu::noinline]] void memo_store_new(std::uint32_t index, MemoEntry entry) {
    if (index <= bytes_.size()) {
      if (index >= memo_.size()) {
        // Doubling past the room reserved up front keeps growth amortized;
        // within it, steps of kMemoStep entries: doubling there wrote ~30 MB
        // of kUnsetMemo never used (a 3M-entry trace memoizes 9M values, the
        // memo grew to 16.8M), each page of it faulted in and zeroed first.
        std::size_t wanted = std::max<std::size_t>(std::size_t{index} + 1, 2 * memo_.size());
        if (std::size_t{index} < memo_.capacity()) {
          wanted = std::min(memo_.capacity(), std::max<std::size_t>(std::size_t{index} + 1, memo_.size() + kMemoStep));
        }
        memo_.resize(std::min(wanted, bytes_.size() + 1), kUnsetMemo);
      }
      if (memo_[index] == kUnsetMemo) ++memo_count_;
      memo_[index] = entry;
    } else {
      const auto [it, inserted] = sparse_memo_.insert_or_assign(index, entry);
      if (inserted) ++memo_count_;
    }
  }
  [[gnu::always_inline]] void memo_get(std::uint32_t index) {
    const MemoEntry entry = index < memo_.size() ? memo_[index] : sparse_memo_get(index);
    if (entry == kUnsetMemo) [[unlikely]] memo_missing(index);
    const MemoEntry kind = entry >> kMemoKindShift;
    if (kind == 0) {
      push(boxed_[entry]);
      return;
    }
    Value value;
    value.kind = kMemoKinds[kind];
    value.length = entry & kMemoIndexMask;
    push(value);
  }

  [[gnu::noinline]] MemoEntry sparse_memo_get(std::uint32_t index) const {
    const auto found = sparse_memo_.find(index);
    return found == sparse_memo_.end() ? kUnsetMemo : found->second;
  }
  [[noreturn, gnu::cold, gnu::noinline]] void memo_missing(std::uint32_t index) const {
    inconsistent("memo index " + std::to_string(index) + " was never stored");
  }

  // --- containers -----------------------------------------------------------

  ContainerId make_container(Kind kind) {
    if (tree_.containers.size() >= kMaxStoredContainers) inconsistent("too many containers");
    tree_.containers.push_back(Container{kind, Shape::items, 0, 0});
    return static_cast<ContainerId>(tree_.containers.size() - 1);
  }

  // The Container of `id` to change in place: a whole entry's is stored
  // from then on in Tree::changed (whose references stay valid).
  Container& changeable(ContainerId id) {
    if (id < kWholeEntryDict) [[likely]]
      return tree_.containers[id];
    const Container made = tree_.container(id);
    return tree_.changed.try_emplace(id, made).first->second;
  }

  ContainerId expect_container(const Value& value, Kind expected) {
    if (value.kind != expected) {
      inconsistent(std::string("expected a ") + to_string(expected) + " on the stack, found a " + to_string(value.kind));
    }
    return value.container();
  }

  // Power-of-two slices: a container grows in place while it has room or
  // sits at the arena's end, and moves to the end otherwise. Appending n
  // items costs O(n) amortized and wastes at most half of each slice.
  static std::size_t capacity(std::size_t size) noexcept { return size == 0 ? 0 : std::bit_ceil(size); }

  void append_items(ContainerId id, const Value* items, std::size_t count) {
    if (count == 0) return;
    Container& c = changeable(id);
    const std::size_t old_size = c.size;
    const std::size_t new_size = old_size + count;
    if (new_size > std::numeric_limits<std::uint32_t>::max()) inconsistent("a container of more than 2^32 items");
    std::vector<Value>& arena = tree_.arena;
    if (new_size > capacity(old_size)) {
      const std::size_t room = capacity(new_size);
      if (old_size != 0 && c.offset + capacity(old_size) == arena.size()) {
        arena.resize(c.offset + room);
      } else {
        const std::size_t at = arena.size();
        arena.resize(at + room);
        std::copy_n(arena.begin() + static_cast<std::ptrdiff_t>(c.offset), old_size,
                    arena.begin() + static_cast<std::ptrdiff_t>(at));
        c.offset = at;
      }
    }
    std::copy_n(items, count, arena.begin() + static_cast<std::ptrdiff_t>(c.offset + old_size));
    c.size = static_cast<std::uint32_t>(new_size);
  }

  // A FrameList or TraceEntry about to change in a way its shape cannot
  // hold: back to plain items, with the same content.
  void to_items(ContainerId id) {
    if (tree_.container(id).shape == Shape::trace_entry) tree_.trace_entry_detached = true;
    std::vector<Value> items(tree_.size(id));
    for (std::size_t i = 0; i < items.size(); ++i) items[i] = tree_.item(id, i);
    Container& c = changeable(id);
    c.shape = Shape::items;
    c.size = 0;
    c.offset = 0;
    append_items(id, items.data(), items.size());
  }

  // The index in Tree::traces of a TraceEntry dict, or -1.
  std::int64_t trace_index(const Value& value) const noexcept {
    if (value.kind != Kind::dict) return -1;
    const Container c = tree_.container(value.container());
    return c.shape == Shape::trace_entry ? static_cast<std::int64_t>(c.offset) : -1;
  }
  // True when items are the TraceEntries numbered first, first + 1, ...
  bool continues_run(const Value* items, std::size_t count, std::uint64_t first) const noexcept {
    for (std::size_t i = 0; i < count; ++i) {
      if (trace_index(items[i]) != static_cast<std::int64_t>(first + i)) return false;
    }
    return true;
  }

  void add_to_list(ContainerId id, const Value* items, std::size_t count) {
    Container& c = changeable(id);
    if (c.shape == Shape::trace_run) {
      if (count != 0 && std::size_t{c.size} + count <= std::numeric_limits<std::uint32_t>::max() &&
          continues_run(items, count, c.offset + c.size)) {
        c.size += static_cast<std::uint32_t>(count);
        return;
      }
      to_items(id);
    } else if (c.kind == Kind::list && c.size == 0 && count != 0 && trace_index(items[0]) >= 0) {
      if (continues_run(items, count, static_cast<std::uint64_t>(trace_index(items[0])))) {
        c.shape = Shape::trace_run;
        c.offset = static_cast<std::uint64_t>(trace_index(items[0]));
        c.size = static_cast<std::uint32_t>(count);
        return;
      }
    } else if (c.shape == Shape::frame_list) {
      to_items(id);
    } else if (c.kind == Kind::list && c.size == 0 && count != 0 && count <= kMaxFrameList &&
               std::all_of(items, items + count, [&](const Value& v) {
                 return v.kind == Kind::dict && tree_.container(v.container()).shape == Shape::items;
               })) {
      c.shape = Shape::frame_list;
      c.size = static_cast<std::uint32_t>(count);
      c.offset = intern_frame_list(items, count);
      return;
    }
    append_items(id, items, count);
  }

  // Frame lists by content: open addressing over FrameList numbers.
  std::uint64_t intern_frame_list(const Value* items, std::size_t count) {
    ContainerId ids[kMaxScannedFrames];
    if (count <= kMaxScannedFrames) {
      for (std::size_t i = 0; i < count; ++i) ids[i] = items[i].container();
      return intern_frame_list(std::span<const ContainerId>(ids, count));
    }
    std::vector<ContainerId> many(count);
    for (std::size_t i = 0; i < count; ++i) many[i] = items[i].container();
    return intern_frame_list(std::span<const ContainerId>(many));
  }
  std::uint64_t intern_frame_list(std::span<const ContainerId> items) {
    if (tree_.frame_lists.size() >= kMaxContainers / 2) inconsistent("too many containers");
    return frame_list_table_.intern(items, tree_.frame_lists, tree_.frame_items);
  }

  void add_to_dict(ContainerId id, const Value* items, std::size_t count) {
    const Container c = tree_.container(id);
    if (c.shape == Shape::trace_entry) {
      if (update_trace_entry(tree_.traces[c.offset], items, count, false)) return;
      to_items(id);
    } else if (c.size == 0 && count != 0) {
      Event entry{};
      if (update_trace_entry(entry, items, count, true)) {
        Container& entry_dict = changeable(id);
        entry_dict.shape = Shape::trace_entry;
        entry_dict.offset = tree_.traces.size();
        entry.stack = StackId{id};
        tree_.traces.push_back(entry);
        tree_.entry_frames.push_back(0);
        return;
      }
    }
    append_items(id, items, count);
  }

  // Applies key/value pairs to a TraceEntry; false, changing nothing, when
  // one of them does not fit the shape (or a new entry has no action).
  bool update_trace_entry(Event& entry, const Value* items, std::size_t count, bool fresh) {
    const std::int8_t* fields = key_fields(items, count);
    if (fields == nullptr) return false;
    Event next = entry;
    bool has_action = false;
    for (std::size_t i = 0; i < count; i += 2) {
      const Value& value = items[i + 1];
      const int field_number = fields[i / 2];
      if (field_number == kActionKey) {
        if (value.kind != Kind::text) return false;
        const int action = meaning(value).action;
        if (action < 0) return false;
        next.kind = static_cast<EventKind>(action);
        has_action = true;
        continue;
      }
      const auto field = static_cast<TraceField>(field_number);
      FieldState state = FieldState::none;
      switch (value.kind) {
        case Kind::none: break;
        case Kind::boolean: state = FieldState::boolean; break;
        case Kind::integer:
          state = value.too_big ? FieldState::too_big : value.flag ? FieldState::negative : FieldState::integer;
          break;
        case Kind::list:
        case Kind::tuple: state = FieldState::container; break;
        default: break;
      }
      if (field == TraceField::frames) {
        if (state != FieldState::none && state != FieldState::container) return false;
        if (state == FieldState::container) next.thread = value.container();
      } else if (field == TraceField::compile_context || field == TraceField::user_metadata) {
        state = FieldState::none;  // kept as present only
      } else {
        if (value.kind != Kind::none && value.kind != Kind::boolean && value.kind != Kind::integer) return false;
        trace_slot(next, field) = value.kind == Kind::none ? 0 : value.magnitude;
      }
      set_field_state(next, field, state);
    }
    if (fresh && !has_action) return false;
    entry = next;
    return true;
  }

  // The field of each key (TraceField or kActionKey), or nullptr when one
  // is no trace-entry key. PyTorch writes every entry's keys in the same
  // order from the same memoized strings, so the last layout is kept and
  // recognized by address.
  const std::int8_t* key_fields(const Value* items, std::size_t count) {
    const std::size_t pairs = count / 2;
    if (pairs == layout_.pairs) {
      bool same = true;
      for (std::size_t p = 0; p < pairs && same; ++p) {
        same = items[2 * p].kind == Kind::text && items[2 * p].text == layout_.keys[p] &&
               items[2 * p].length == layout_.lengths[p];
      }
      if (same) return layout_.fields.data();
    }
    if (pairs > layout_.fields.size()) return nullptr;  // no trace entry has that many keys
    KeyLayout fresh_layout;
    for (std::size_t p = 0; p < pairs; ++p) {
      const Value& key = items[2 * p];
      if (key.kind != Kind::text) return nullptr;
      const int field = meaning(key).key;
      if (field == kNotATraceKey) return nullptr;
      fresh_layout.keys[p] = key.text;
      fresh_layout.lengths[p] = key.length;
      fresh_layout.fields[p] = static_cast<std::int8_t>(field);
    }
    fresh_layout.pairs = pairs;
    layout_ = fresh_layout;
    return layout_.fields.data();
  }

  // Keys and actions are memoized strings: PyTorch writes each once and
  // BINGETs it after, so the same bytes come back at the same address. A
  // small cache by address answers almost every lookup without a compare.
  const TraceMeaning& meaning(const Value& text) {
    const auto address = reinterpret_cast<std::uintptr_t>(text.text);
    TraceMeaning& slot = meanings_[(address * 0x9e3779b97f4a7c15ull) >> 56];
    if (slot.text == text.text && slot.length == text.length) return slot;
    slot.text = text.text;
    slot.length = text.length;
    slot.key = static_cast<std::int8_t>(trace_key_of(text.view()));
    const auto action = trace_action_of(text.view());
    slot.action = action ? static_cast<std::int8_t>(*action) : std::int8_t{-1};
    return slot;
  }

  void collect(Kind kind) {
    const std::size_t mark = pop_mark();
    const std::size_t count = stack_.size() - mark;
    if (count % 2 != 0 && kind == Kind::dict) inconsistent("DICT with an odd number of items");
    const ContainerId id = make_container(kind);
    const Value* items = stack_.data() + mark;
    if (kind == Kind::dict) add_to_dict(id, items, count);
    else if (kind == Kind::list) add_to_list(id, items, count);
    else append_items(id, items, count);
    stack_.resize(mark);
    push_container(id);
  }

  void small_tuple(std::size_t count) {
    if (stack_.size() < floor() + count) inconsistent("the stack holds too few items");
    const ContainerId id = make_container(Kind::tuple);
    append_items(id, stack_.data() + (stack_.size() - count), count);
    stack_.resize(stack_.size() - count);
    push_container(id);
  }

  void append() {
    const Value value = pop();
    add_to_list(expect_container(top(), Kind::list), &value, 1);
  }

  void set_item() {
    const Value value = pop();
    const Value key = pop();
    const Value items[2] = {key, value};
    add_to_dict(expect_container(top(), Kind::dict), items, 2);
  }

  void extend(Kind kind) {
    const std::size_t mark = pop_mark();
    const std::size_t count = stack_.size() - mark;
    if (kind == Kind::dict && count % 2 != 0) inconsistent("SETITEMS with an odd number of items");
    if (mark <= floor()) inconsistent("no container below the MARK");
    const ContainerId id = expect_container(stack_[mark - 1], kind);
    if (kind == Kind::dict) add_to_dict(id, stack_.data() + mark, count);
    else add_to_list(id, stack_.data() + mark, count);
    stack_.resize(mark);
    const Container c = tree_.container(id);
    if (c.shape == Shape::trace_run && c.offset + c.size == tree_.traces.size() && stack_.size() == mark &&
        !stack_.empty() && stack_.back().kind == Kind::list && stack_.back().container() == id) {
      trace_batch_closed_at_ = position_;  // a MARK right here starts the next batch of a trace
    }
  }

  // --- trace entries in one step -----------------------------------------------

  // Raw pointers into memo_, boxed_ and the containers: valid only until one
  // of them next grows, so take a view where it is used, never keep one.
  MemoView memo_view() const noexcept {
    return MemoView{memo_.data(), memo_count_, boxed_.data(), tree_.containers.data()};
  }

  // After an EMPTY_DICT: a whole trace entry in one step (pickle_entry.hpp),
  // or false, having changed nothing, and the opcodes run one by one.
  bool read_trace_entry() {
    if (!memo_dense_ || !options_.whole_entries || tree_.traces.size() > kWholeEntryIndexMask) return false;
    const MemoView memo = memo_view();
    if (!scanner_.scan(reinterpret_cast<const std::uint8_t*>(bytes_.data()), position_, bytes_.size(), memo, false,
                       scanned_)) {
      return false;
    }
    apply(scanned_);
    if (options_.stats != nullptr) ++options_.stats->entries_read_whole;
    // How the next entry begins, for the parallel readers to find one.
    const auto* data = reinterpret_cast<const std::uint8_t*>(bytes_.data());
    const std::size_t key = op_offset_ + 3;
    if (key < position_ && (data[key] == 0x68 || data[key] == 0x6a)) {
      entry_start_length_ = data[key] == 0x68 ? 5 : 8;
      std::memcpy(entry_start_.data(), data + op_offset_, entry_start_length_);
    }
    return true;
  }

  // What the opcodes of a scanned entry do, in their order: the dict, then
  // each memoized value, then the TraceEntry record and the dict on the stack.
  void apply(const ScannedEntry& entry) {
    const auto entry_index = static_cast<ContainerId>(tree_.traces.size());
    const ContainerId dict = kWholeEntryDict | entry_index;
    Event record = entry.record;
    std::uint32_t frames = 0;
    for (std::size_t i = 0; i < entry.memoized_count; ++i) {
      MemoEntry stored = 0;
      switch (entry.memoized[i]) {
        case ScannedEntry::Memoized::dict: stored = (memo_kind_bits(Kind::dict) << kMemoKindShift) | dict; break;
        case ScannedEntry::Memoized::text: stored = box_text(entry.text[i], entry.text_length[i]); break;
        case ScannedEntry::Memoized::frames: {
          const ContainerId list = kWholeEntryFrames | entry_index;
          if (entry.frame_count != 0) {
            frames = static_cast<std::uint32_t>(
                intern_frame_list(std::span<const ContainerId>(entry.frames, entry.frame_count)) + 1);
          }
          record.thread = list;
          stored = (memo_kind_bits(Kind::list) << kMemoKindShift) | list;
          break;
        }
      }
      memo_store(memo_count_, stored);
    }
    record.stack = StackId{dict};
    tree_.traces.push_back(record);
    tree_.entry_frames.push_back(frames);
    Value value;
    value.kind = Kind::dict;
    value.length = dict;
    push(value);
  }

  // --- a long trace list on several threads ------------------------------------

  // Called at the MARK that opens a batch of a trace list (the list is on the
  // stack, its TraceRun ends at the last TraceEntry). Splits the bytes left
  // into one chunk per thread, each starting at an entry (found by the bytes
  // the last entry started with), reads the chunks side by side, and keeps
  // the run of chunks that join up: chunk k must stop exactly where chunk
  // k + 1 starts, which proves that start an opcode boundary. The tree, the
  // memo and the stack then stand as after reading those bytes one opcode at
  // a time, and reading goes on from where the last kept chunk stopped.
  void read_trace_in_parallel() {
    if (!memo_dense_ || entry_start_length_ == 0 || !options_.whole_entries) return;
    const auto* data = reinterpret_cast<const std::uint8_t*>(bytes_.data());
    const std::size_t size = bytes_.size();
    const std::size_t first = position_;
    const std::size_t threads =
        std::min<std::size_t>(options_.threads, std::max<std::size_t>(1, (size - first) / options_.min_chunk_bytes));
    if (threads < 2) return;
    if (options_.stats != nullptr) ++options_.stats->parallel_tries;

    // Chunk starts: the first entry at or after an even share of the bytes.
    std::vector<std::size_t> starts{first};
    for (std::size_t k = 1; k < threads; ++k) {
      const std::size_t from = first + (size - first) / threads * k;
      if (from <= starts.back()) continue;
      const void* found = ::memmem(data + from, size - from, entry_start_.data(), entry_start_length_);
      if (found == nullptr) break;
      const auto at = static_cast<std::size_t>(static_cast<const std::uint8_t*>(found) - data);
      if (at > starts.back()) starts.push_back(at);
    }
    std::vector<ChunkReader> chunks(starts.size());
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      chunks[k].begin = starts[k];
      chunks[k].stop = k + 1 < starts.size() ? starts[k + 1] : size;
    }
    // The count pass's view. The presizing below stays within the vectors'
    // capacity, so these pointers hold until the resizes before the write
    // pass, which takes a fresh view (a view never outlives a reallocation).
    const MemoView counting_memo = memo_view();
    // Runs step(k) for every chunk, one thread each, and `meanwhile` on this
    // thread (or chunk 0's step when there is nothing else to do), and waits.
    auto each_chunk = [&](std::size_t count, auto step, auto meanwhile) {
      std::vector<std::thread> workers;
      constexpr bool kMeanwhile = !std::is_same_v<decltype(meanwhile), std::nullptr_t>;
      for (std::size_t k = kMeanwhile ? 0 : 1; k < count; ++k) {
        auto run = [&, k] {
          try {
            step(k);
          } catch (...) {  // out of memory: the one-thread read will say so
            chunks[k].failed = true;
          }
        };
        try {
          workers.emplace_back(run);
        } catch (const std::system_error&) {
          run();  // no thread to be had: this one does it
        }
      }
      if constexpr (kMeanwhile) {
        meanwhile();
      } else {
        try {
          step(0);
        } catch (...) {
          chunks[0].failed = true;
        }
      }
      for (std::thread& worker : workers) worker.join();
    };

    // Count; meanwhile, size the tree's arrays to all the room they reserved
    // (constructing and faulting in ~300 MB is a sequential cost as long as
    // the counting), cut to size once the counts are known.
    const ChunkBase start{tree_.containers.size(), tree_.traces.size(), memo_count_, boxed_.size(), {}};
    const std::size_t memo_entries = memo_.size();
    struct Restore {  // unless the chunks are kept
      Unpickler& self;
      ChunkBase start;
      std::size_t memo_entries;
      bool done = false;
      ~Restore() {
        if (done) return;
        self.tree_.containers.resize(start.containers);
        self.tree_.traces.resize(start.records);
        self.tree_.entry_frames.resize(start.records);
        self.memo_.resize(memo_entries);
      }
    } restore{*this, start, memo_entries};
    each_chunk(
        chunks.size(), [&](std::size_t k) { chunks[k].count(data, size, counting_memo); },
        [&] {
          // PyTorch's entries take ~62 bytes, with two containers and three
          // memo entries each; a little over that, within the room reserved.
          if (presized_) return;
          presized_ = true;
          const std::size_t entries = (size - first) / 56;
          auto presize = [](auto& vector, std::size_t wanted, const auto&... fill) {
            vector.resize(std::max(vector.size(), std::min(vector.capacity(), wanted)), fill...);
          };
          presize(tree_.traces, start.records + entries);
          presize(tree_.entry_frames, start.records + entries);
          presize(memo_, std::size_t{start.memo} + 3 * entries, kUnsetMemo);
        });
    // The run of chunks that join up: chunk k must stop exactly where chunk
    // k + 1 starts (proving that start an opcode boundary) and inside a batch
    // (chunk k + 1 starts with an entry). The first that does not is kept
    // too (it started at a boundary and stopped at one) and ends the run.
    std::size_t kept = 0;
    while (kept < chunks.size()) {
      const ChunkReader& chunk = chunks[kept++];
      if (chunk.failed) throw ParallelReadAbandoned{};
      if (chunk.end != chunk.stop || !chunk.open_at_end) break;
    }
    // A short try (chunks thrown away, or nothing read): back off by the
    // bytes it counted in vain, and by a chunk's worth at least.
    if (kept < chunks.size() || chunks[0].records == 0) {
      std::size_t wasted = 0;
      for (std::size_t k = kept; k < chunks.size(); ++k) {
        if (chunks[k].end > chunks[k].begin) wasted += chunks[k].end - chunks[k].begin;
      }
      next_parallel_at_ = chunks[kept - 1].end + std::max(wasted, options_.min_chunk_bytes);
    }
    chunks.resize(kept);
    if (chunks.size() == 1 && chunks[0].records == 0) return;

    // Each chunk's place in the tree.
    std::vector<ChunkBase> bases(chunks.size());
    ChunkBase next{start.containers, start.records, start.memo, start.boxes, {}};
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      const ChunkReader& chunk = chunks[k];
      bases[k] = ChunkBase{next.containers, next.records, next.memo, next.boxes, {}};
      for (const FrameList& list : chunk.frame_lists) {
        bases[k].frame_lists.push_back(intern_frame_list(
            std::span<const ContainerId>(chunk.frame_items.data() + list.offset, list.size)));
      }
      next.records += chunk.records;
      next.memo += chunk.memo;
      next.boxes += chunk.boxes;
    }
    if (next.containers > kMaxStoredContainers || next.boxes > kMaxContainers || next.memo > size ||
        next.records > std::size_t{kWholeEntryIndexMask} + 1) {
      throw ParallelReadAbandoned{};
    }
    tree_.containers.resize(next.containers);
    tree_.traces.resize(next.records);
    tree_.entry_frames.resize(next.records);
    // The memo keeps all its room: cut to the chunks alone, the next MEMOIZE
    // would double it, copying ~40 MB.
    if (memo_.size() < next.memo) memo_.resize(next.memo, kUnsetMemo);
    boxed_.resize(next.boxes);
    restore.done = true;

    // Write, side by side; then follow the references into earlier chunks.
    // The resizes above may have moved memo_, boxed_ and the containers.
    const MemoView memo = memo_view();
    const TreeSlots slots{tree_.containers.data(), tree_.traces.data(), tree_.entry_frames.data(), memo_.data(),
                          boxed_.data()};
    std::vector<std::uint8_t> written(chunks.size(), 0);
    each_chunk(
        chunks.size(), [&](std::size_t k) { written[k] = chunks[k].write(data, size, memo, bases[k], slots); }, nullptr);
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      if (chunks[k].failed || written[k] == 0) throw ParallelReadAbandoned{};
      for (const ChunkReader::Fixup& fixup : chunks[k].fixups) {
        if (!ChunkReader::follow(fixup.ref, memo_[fixup.ref.index], boxed_.data(), tree_.traces[fixup.record])) {
          throw ParallelReadAbandoned{};
        }
      }
    }

    // The stack, the marks and the trace list, as the batches left them.
    memo_count_ = static_cast<std::uint32_t>(next.memo);
    const ContainerId list = stack_.back().container();
    std::size_t open_batch = 0;
    bool any_appends = false;
    for (const ChunkReader& chunk : chunks) {
      open_batch = chunk.has_appends ? chunk.entries_after_appends : open_batch + chunk.records;
      any_appends = any_appends || chunk.has_appends;
    }
    const std::size_t added = next.records - bases[0].records;
    if (!any_appends) open_batch = added;
    const std::size_t closed = added - open_batch;
    Container& run = changeable(list);
    if (run.size + closed > std::numeric_limits<std::uint32_t>::max()) throw ParallelReadAbandoned{};
    run.size += static_cast<std::uint32_t>(closed);
    if (chunks.back().open_at_end) {
      for (std::size_t r = next.records - open_batch; r < next.records; ++r) push_container(tree_.traces[r].stack.value);
    } else {
      marks_.pop_back();
    }
    position_ = chunks.back().end;
    if (options_.stats != nullptr) {
      options_.stats->entries_read_in_parallel += added;
      options_.stats->chunks += chunks.size();
    }
  }

  // --- scalars ----------------------------------------------------------------

  void push_integer(bool negative, std::uint64_t magnitude) {
    Value value;
    value.kind = Kind::integer;
    value.flag = negative && magnitude != 0;
    value.magnitude = magnitude;
    push(value);
  }

  // LONG1/LONG4: little-endian two's complement of any length.
  void long_integer(std::uint64_t length) {
    const std::byte* raw = take(length);
    if (length != 0 && length < 8 && (std::to_integer<unsigned>(raw[length - 1]) & 0x80u) == 0) {
      // The usual LONG1: an address or a time in microseconds, non-negative, under 2^56.
      std::uint64_t bits = 0;
      for (std::size_t i = static_cast<std::size_t>(length); i-- > 0;) bits = (bits << 8) | std::to_integer<std::uint64_t>(raw[i]);
      push_integer(false, bits);
      return;
    }
    if (length == 0) {
      push_integer(false, 0);
      return;
    }
    const std::size_t size = static_cast<std::size_t>(length);
    const bool negative = (std::to_integer<unsigned>(raw[size - 1]) & 0x80u) != 0;
    const std::uint8_t extension = negative ? 0xff : 0x00;
    Value value;
    value.kind = Kind::integer;
    value.flag = negative;
    // Bytes past the 8th must only extend the sign for the value to fit in 64 bits.
    for (std::size_t i = 8; i < size; ++i) {
      if (std::to_integer<std::uint8_t>(raw[i]) != extension) value.too_big = true;
    }
    std::uint64_t bits = 0;
    const std::size_t low = size < 8 ? size : 8;
    for (std::size_t i = low; i-- > 0;) bits = (bits << 8) | std::to_integer<std::uint64_t>(raw[i]);
    if (negative) {
      if (low < 8) bits |= ~std::uint64_t{0} << (8 * low);
      // A value below -2^64 + 1 or one whose low 8 bytes read as non-negative
      // does not fit: -2^63 .. -1 sign-extends, the rest is too big.
      if (size > 8 && (bits >> 63) == 0) value.too_big = true;
      value.magnitude = ~bits + 1;
    } else {
      value.magnitude = bits;
    }
    push(value);
  }

  void push_text(Kind kind, std::uint64_t length) {
    const std::byte* raw = take(length);  // checked against the bytes left first
    if (length > std::numeric_limits<std::uint32_t>::max()) inconsistent("a string of 4 GiB or more");
    Value value;
    value.kind = kind;
    value.length = static_cast<std::uint32_t>(length);
    value.text = reinterpret_cast<const char*>(raw);
    push(value);
  }

  std::span<const std::byte> bytes_;
  ParseOptions options_;
  std::size_t position_ = 0;
  std::size_t op_offset_ = 0;
  std::uint8_t op_ = 0;
  Tree tree_;
  ValueStack stack_;
  std::vector<std::size_t> marks_;
  std::vector<MemoEntry> memo_;
  std::unordered_map<std::uint32_t, MemoEntry> sparse_memo_;
  std::uint32_t memo_count_ = 0;  // entries stored: MEMOIZE's next index, as len(memo) in Python
  // Every entry so far was stored at index memo_count_ (MEMOIZE, as every
  // protocol 4+ pickle does): indices below memo_count_ are all set, and
  // those at or past it are not. read_trace_entry() relies on it.
  bool memo_dense_ = true;
  EntryScanner scanner_;
  ScannedEntry scanned_;
  // The bytes an entry starts with (EMPTY_DICT MEMOIZE MARK and the BINGET of
  // its first key), as the last entry read whole did.
  std::array<std::uint8_t, 8> entry_start_{};
  std::size_t entry_start_length_ = 0;
  std::size_t trace_batch_closed_at_ = std::numeric_limits<std::size_t>::max();
  // Where the next parallel read may start. A trace whose entries the
  // threads stop at (say, one in three not of the shape they take) would
  // otherwise be tried again at every batch of 1000 entries, each try
  // counting ahead in every chunk: quadratic in the trace (with the presize
  // below, 87% of reading a 3M-event pickle of our own old writer's on 2
  // cores). After a short try, one thread reads at least the bytes it
  // counted in vain, and a chunk's worth, before the next: all tries
  // together count at most the file once more.
  std::size_t next_parallel_at_ = 0;
  // The tree's arrays were sized to their reserved room once: a second
  // presize would construct hundreds of MB again for every try.
  bool presized_ = false;
  std::vector<Value> boxed_;       // memoized scalars
  FrameListTable frame_list_table_;
  std::array<TraceMeaning, 256> meanings_{};
  struct KeyLayout {
    std::size_t pairs = kNoLayout;
    std::array<const char*, 16> keys{};
    std::array<std::uint32_t, 16> lengths{};
    std::array<std::int8_t, 16> fields{};
  };
  static constexpr std::size_t kNoLayout = ~std::size_t{0};
  KeyLayout layout_;
};

}  // namespace

const char* to_string(Kind kind) noexcept {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::text: return "str";
    case Kind::bytes: return "bytes";
    case Kind::list: return "list";
    case Kind::tuple: return "tuple";
    case Kind::dict: return "dict";
  }
  return "?";
}

std::string_view trace_key(TraceField field) noexcept {
  switch (field) {
    case TraceField::addr: return "addr";
    case TraceField::size: return "size";
    case TraceField::stream: return "stream";
    case TraceField::time_us: return "time_us";
    case TraceField::device_free: return "device_free";
    case TraceField::frames: return "frames";
    case TraceField::compile_context: return "compile_context";
    case TraceField::user_metadata: return "user_metadata";
  }
  return "";
}

std::string_view trace_action_name(EventKind kind) noexcept {
  switch (kind) {
    case EventKind::alloc: return "alloc";
    case EventKind::free_requested: return "free_requested";
    case EventKind::free_completed: return "free_completed";
    case EventKind::segment_alloc: return "segment_alloc";
    case EventKind::segment_release: return "segment_free";
    case EventKind::segment_map: return "segment_map";
    case EventKind::segment_unmap: return "segment_unmap";
    case EventKind::snapshot: return "snapshot";
    case EventKind::oom: return "oom";
    default: return "";
  }
}

namespace {
Value text_value(std::string_view text) noexcept {
  Value value;
  value.kind = Kind::text;
  value.length = static_cast<std::uint32_t>(text.size());
  value.text = text.data();
  return value;
}
}  // namespace

std::optional<Value> Tree::trace_value(const Event& entry, TraceField field) const noexcept {
  Value value;
  switch (field_state(entry, field)) {
    case FieldState::absent: return std::nullopt;
    case FieldState::none: return value;
    case FieldState::container:
      value.kind = container(entry.thread).kind;
      value.length = entry.thread;
      return value;
    case FieldState::boolean:
      value.kind = Kind::boolean;
      value.magnitude = trace_slot(entry, field);
      value.flag = value.magnitude != 0;
      return value;
    case FieldState::integer:
    case FieldState::negative:
    case FieldState::too_big:
      value.kind = Kind::integer;
      value.magnitude = trace_slot(entry, field);
      value.flag = field_state(entry, field) == FieldState::negative;
      value.too_big = field_state(entry, field) == FieldState::too_big;
      return value;
  }
  return std::nullopt;
}

Container Tree::changed_container(ContainerId id) const noexcept {
  const auto found = changed.find(id);
  if (found != changed.end()) return found->second;
  const std::uint32_t index = id & kWholeEntryIndexMask;
  if ((id & kWholeEntryFrames) != kWholeEntryFrames) return Container{Kind::dict, Shape::trace_entry, 0, index};
  const std::uint32_t list = entry_frames[index];
  if (list == 0) return Container{Kind::list, Shape::items, 0, 0};
  return Container{Kind::list, Shape::frame_list, frame_lists[list - 1].size, list - 1};
}

std::size_t Tree::size(ContainerId id) const noexcept {
  const Container c = container(id);
  if (c.shape == Shape::trace_run) return c.offset + c.size <= traces.size() ? c.size : 0;  // 0: moved into the events
  if (c.shape != Shape::trace_entry) return c.size;
  if (c.offset >= traces.size()) return 0;  // already moved into the model's events
  std::size_t fields = 1;                    // the action
  for (int f = 0; f < kTraceFieldCount; ++f) {
    if (field_state(traces[c.offset], static_cast<TraceField>(f)) != FieldState::absent) ++fields;
  }
  return 2 * fields;
}

Value Tree::item(ContainerId id, std::size_t index) const noexcept {
  const Container c = container(id);
  switch (c.shape) {
    case Shape::items: return arena[c.offset + index];
    case Shape::frame_list: {
      Value value;
      value.kind = Kind::dict;
      value.length = frame_items[frame_lists[c.offset].offset + index];
      return value;
    }
    case Shape::trace_run: {
      Value value;
      value.kind = Kind::dict;
      value.length = traces[c.offset + index].stack.value;
      return value;
    }
    case Shape::trace_entry: break;
  }
  const Event& entry = traces[c.offset];
  // The action, then the fields present, in TraceField order.
  std::size_t pair = index / 2;
  if (pair == 0) return index % 2 == 0 ? text_value("action") : text_value(trace_action_name(entry.kind));
  for (int f = 0; f < kTraceFieldCount; ++f) {
    const auto field = static_cast<TraceField>(f);
    if (field_state(entry, field) == FieldState::absent) continue;
    if (--pair == 0) return index % 2 == 0 ? text_value(trace_key(field)) : *trace_value(entry, field);
  }
  return Value{};
}

std::optional<Value> Tree::find(ContainerId dict, std::string_view key) const noexcept {
  const Container c = container(dict);
  if (c.shape == Shape::trace_entry) {
    if (c.offset >= traces.size()) return std::nullopt;
    const int field = trace_key_of(key);
    if (field == kNotATraceKey) return std::nullopt;
    const Event& entry = traces[c.offset];
    if (field == kActionKey) return text_value(trace_action_name(entry.kind));
    return trace_value(entry, static_cast<TraceField>(field));
  }
  // Linear, from the end so a repeated key resolves as in Python.
  for (std::size_t i = c.size; i >= 2; i -= 2) {
    const Value& candidate = arena[c.offset + i - 2];
    if (candidate.kind == Kind::text && candidate.view() == key) return arena[c.offset + i - 1];
  }
  return std::nullopt;
}

Tree parse(std::span<const std::byte> bytes, const ParseOptions& options) {
  ParseOptions settings = options;
  if (settings.threads == 0) settings.threads = detail::reader_threads();
  try {
    return Unpickler(bytes, settings).run();
  } catch (const ParallelReadAbandoned&) {
    // Something the threads cannot vouch for: read it all again on one
    // thread, which reads (or rejects) every pickle.
    settings.threads = 1;
    if (settings.stats != nullptr) {
      const std::uint64_t restarts = settings.stats->parallel_restarts + 1;
      *settings.stats = detail::PickleReadStats{};
      settings.stats->parallel_restarts = restarts;
    }
    return Unpickler(bytes, settings).run();
  }
}

}  // namespace cachealloc::snapshot::pickle
