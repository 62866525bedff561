// The restricted unpickler's opcodes: the value stack, the memo, the
// containers and scalars they build, and PyTorch's trace entries read whole
// (pickle_entry.hpp); parse(), which runs it.
#include "unpickler.hpp"

#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "cachealloc/snapshot/format.hpp"
#include "huge_pages.hpp"
#include "parallel.hpp"
#include "pickle_opcodes.hpp"

namespace cachealloc::snapshot::pickle {

namespace {

// Open MARKs: nesting of (  ... LIST/DICT/TUPLE/APPENDS/SETITEMS.
constexpr std::size_t kMaxMarks = 1000;

// The one empty tuple every EMPTY_TUPLE pushes: tuples are immutable.
constexpr ContainerId kEmptyTuple = 0;
// The memo grows by this many entries (1 MiB) within the room reserved.
constexpr std::size_t kMemoStep = std::size_t{1} << 18;
// A list of more dicts than this stays plain items: frame lists are short,
// and a long list of dicts (a trace, the segments) is read once anyway.
constexpr std::size_t kMaxFrameList = 4096;

// Inputs from which the tree's big arrays ask for huge pages.
constexpr std::size_t kHugePagesFrom = std::size_t{32} << 20;

std::string hex_byte(std::uint8_t value) {
  std::array<char, 8> text{};
  std::snprintf(text.data(), text.size(), "0x%02x", static_cast<unsigned>(value));
  return text.data();
}

}  // namespace

Unpickler::Unpickler(std::span<const std::byte> bytes, const ParseOptions& options) : bytes_(bytes), options_(options) {
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

Tree Unpickler::run() {
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

// Returns true at STOP. The common opcodes come first in one switch; each
// reads its argument with one bounds check.
bool Unpickler::step() {
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

void Unpickler::reject() const {
  const OpcodeInfo info = describe_opcode(op_);
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

void Unpickler::inconsistent(const std::string& what) const {
  const OpcodeInfo info = describe_opcode(op_);
  throw SnapshotError(ErrorCode::inconsistent, "bad pickle: " + what + " (" +
                                                   (info.name != nullptr ? info.name : "opcode") + " at offset " +
                                                   std::to_string(op_offset_) + ")");
}

void Unpickler::truncated_length(std::uint64_t wanted) const {
  const OpcodeInfo info = describe_opcode(op_);
  throw SnapshotError(ErrorCode::truncated,
                      std::string("truncated pickle: ") + (info.name != nullptr ? info.name : "opcode") +
                          " at offset " + std::to_string(op_offset_) + " needs " + std::to_string(wanted) +
                          " bytes but only " + std::to_string(remaining()) + " remain");
}

std::size_t Unpickler::remaining() const noexcept { return bytes_.size() - position_; }

// The next `length` bytes, checked against the bytes left before anything
// is allocated or read.
// Error paths live out of line (gnu::cold) so the hot opcodes keep a
// short prologue: a BINGET is about a dozen instructions.
const std::byte* Unpickler::take(std::uint64_t length) {
  if (length > remaining()) [[unlikely]] past_end(length);
  const std::byte* out = bytes_.data() + position_;
  position_ += static_cast<std::size_t>(length);
  return out;
}

void Unpickler::past_end(std::uint64_t length) const {
  if (position_ == op_offset_) {
    throw SnapshotError(ErrorCode::truncated, "truncated pickle: it ends at offset " + std::to_string(position_) +
                                                  " without a STOP opcode");
  }
  truncated_length(length);
}

std::uint8_t Unpickler::read_u8() { return std::to_integer<std::uint8_t>(*take(1)); }

template <std::size_t Width>
std::uint64_t Unpickler::read_le() {
  static_assert(std::endian::native == std::endian::little, "pickle integers are little-endian");
  const std::byte* raw = take(Width);
  std::uint64_t value = 0;
  std::memcpy(&value, raw, Width);
  return value;
}

std::size_t Unpickler::floor() const noexcept { return marks_.empty() ? 0 : marks_.back(); }

void Unpickler::grow_stack() {
  if (stack_.capacity() >= kMaxStack) too_deep();
  stack_.grow();
}

void Unpickler::too_deep() const {
  inconsistent("nesting too deep: more than " + std::to_string(kMaxStack) + " values on the stack");
}

void Unpickler::push_boolean(bool flag) {
  Value value;
  value.kind = Kind::boolean;
  value.flag = flag;
  value.magnitude = flag ? 1 : 0;
  push(value);
}

void Unpickler::stack_empty() const { inconsistent("the stack is empty"); }

Value Unpickler::pop() {
  if (stack_.size() <= floor()) stack_empty();
  const Value value = stack_.back();
  stack_.pop_back();
  return value;
}

const Value& Unpickler::top() {
  if (stack_.size() <= floor()) stack_empty();
  return stack_.back();
}

std::size_t Unpickler::pop_mark() {
  if (marks_.empty()) inconsistent("no MARK to close");
  const std::size_t mark = marks_.back();
  marks_.pop_back();
  return mark;
}

// Dense up to one entry per input byte (each PUT costs at least one byte,
// so the memo stays linear in the input); a sparse index past that, which
// only a hand-made pickle has, goes to a map.
void Unpickler::memo_put(std::uint32_t index) {
  const Value& value = top();
  MemoEntry entry = 0;
  if (value.is_container()) [[likely]] {
    entry = (memo_kind_bits(value.kind) << kMemoKindShift) | value.container();
  } else {
    entry = box(value);
  }
  memo_store(index, entry);
}

void Unpickler::memo_store(std::uint32_t index, MemoEntry entry) {
  if (index != memo_count_) memo_dense_ = false;
  if (index < memo_.size()) [[likely]] {
    if (memo_[index] == kUnsetMemo) ++memo_count_;
    memo_[index] = entry;
    return;
  }
  memo_store_new(index, entry);
}

MemoEntry Unpickler::box(const Value& value) {
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
MemoEntry Unpickler::box_text(const char* text, std::uint32_t length) {
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

void Unpickler::memo_store_new(std::uint32_t index, MemoEntry entry) {
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

void Unpickler::memo_get(std::uint32_t index) {
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

MemoEntry Unpickler::sparse_memo_get(std::uint32_t index) const {
  const auto found = sparse_memo_.find(index);
  return found == sparse_memo_.end() ? kUnsetMemo : found->second;
}

void Unpickler::memo_missing(std::uint32_t index) const {
  inconsistent("memo index " + std::to_string(index) + " was never stored");
}

ContainerId Unpickler::make_container(Kind kind) {
  if (tree_.containers.size() >= kMaxStoredContainers) inconsistent("too many containers");
  tree_.containers.push_back(Container{kind, Shape::items, 0, 0});
  return static_cast<ContainerId>(tree_.containers.size() - 1);
}

ContainerId Unpickler::expect_container(const Value& value, Kind expected) {
  if (value.kind != expected) {
    inconsistent(std::string("expected a ") + to_string(expected) + " on the stack, found a " + to_string(value.kind));
  }
  return value.container();
}

// Power-of-two slices: a container grows in place while it has room or
// sits at the arena's end, and moves to the end otherwise. Appending n
// items costs O(n) amortized and wastes at most half of each slice.
std::size_t Unpickler::capacity(std::size_t size) noexcept { return size == 0 ? 0 : std::bit_ceil(size); }

void Unpickler::append_items(ContainerId id, const Value* items, std::size_t count) {
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
void Unpickler::to_items(ContainerId id) {
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
std::int64_t Unpickler::trace_index(const Value& value) const noexcept {
  if (value.kind != Kind::dict) return -1;
  const Container c = tree_.container(value.container());
  return c.shape == Shape::trace_entry ? static_cast<std::int64_t>(c.offset) : -1;
}

// True when items are the TraceEntries numbered first, first + 1, ...
bool Unpickler::continues_run(const Value* items, std::size_t count, std::uint64_t first) const noexcept {
  for (std::size_t i = 0; i < count; ++i) {
    if (trace_index(items[i]) != static_cast<std::int64_t>(first + i)) return false;
  }
  return true;
}

void Unpickler::add_to_list(ContainerId id, const Value* items, std::size_t count) {
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
std::uint64_t Unpickler::intern_frame_list(const Value* items, std::size_t count) {
  ContainerId ids[kMaxScannedFrames];
  if (count <= kMaxScannedFrames) {
    for (std::size_t i = 0; i < count; ++i) ids[i] = items[i].container();
    return intern_frame_list(std::span<const ContainerId>(ids, count));
  }
  std::vector<ContainerId> many(count);
  for (std::size_t i = 0; i < count; ++i) many[i] = items[i].container();
  return intern_frame_list(std::span<const ContainerId>(many));
}

void Unpickler::add_to_dict(ContainerId id, const Value* items, std::size_t count) {
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
bool Unpickler::update_trace_entry(Event& entry, const Value* items, std::size_t count, bool fresh) {
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
const std::int8_t* Unpickler::key_fields(const Value* items, std::size_t count) {
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
const TraceMeaning& Unpickler::meaning(const Value& text) {
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

void Unpickler::collect(Kind kind) {
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

void Unpickler::small_tuple(std::size_t count) {
  if (stack_.size() < floor() + count) inconsistent("the stack holds too few items");
  const ContainerId id = make_container(Kind::tuple);
  append_items(id, stack_.data() + (stack_.size() - count), count);
  stack_.resize(stack_.size() - count);
  push_container(id);
}

void Unpickler::append() {
  const Value value = pop();
  add_to_list(expect_container(top(), Kind::list), &value, 1);
}

void Unpickler::set_item() {
  const Value value = pop();
  const Value key = pop();
  const Value items[2] = {key, value};
  add_to_dict(expect_container(top(), Kind::dict), items, 2);
}

void Unpickler::extend(Kind kind) {
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

// After an EMPTY_DICT: a whole trace entry in one step (pickle_entry.hpp),
// or false, having changed nothing, and the opcodes run one by one.
bool Unpickler::read_trace_entry() {
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
void Unpickler::apply(const ScannedEntry& entry) {
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

void Unpickler::push_integer(bool negative, std::uint64_t magnitude) {
  Value value;
  value.kind = Kind::integer;
  value.flag = negative && magnitude != 0;
  value.magnitude = magnitude;
  push(value);
}

// LONG1/LONG4: little-endian two's complement of any length.
void Unpickler::long_integer(std::uint64_t length) {
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

void Unpickler::push_text(Kind kind, std::uint64_t length) {
  const std::byte* raw = take(length);  // checked against the bytes left first
  if (length > std::numeric_limits<std::uint32_t>::max()) inconsistent("a string of 4 GiB or more");
  Value value;
  value.kind = kind;
  value.length = static_cast<std::uint32_t>(length);
  value.text = reinterpret_cast<const char*>(raw);
  push(value);
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
