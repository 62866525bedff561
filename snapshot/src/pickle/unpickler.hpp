// The restricted unpickler, a stack machine over the opcodes that build plain
// data (pickle.hpp): unpickler.cpp runs the opcodes, parallel_reader.cpp reads
// a long trace list on threads. Private to the snapshot library.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "pickle_entry.hpp"
#include "pickle_value.hpp"

namespace cachealloc::snapshot::pickle {

// Values waiting on the stack. PyTorch's pickles never hold more than a few
// thousand (the pickler batches APPENDS/SETITEMS by 1000 and the schema is
// about 7 levels deep); the cap turns a file of 100k nested lists into an
// error instead of a large stack.
inline constexpr std::size_t kMaxStack = 1u << 16;
// Container ids and boxed scalars fit in the 30 bits of a MemoEntry.
inline constexpr std::size_t kMaxContainers = (std::size_t{1} << 30) - 1;
// Stored containers' ids stay below the whole entries' (pickle_value.hpp).
inline constexpr std::size_t kMaxStoredContainers = kWholeEntryDict - 1;

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

// Whether a text equals the last one boxed: PyTorch memoizes a fresh 'N/A'
// in every trace entry, and equal scalars in a row share one box. Inline,
// since it runs per entry; the texts are a few bytes.
inline bool same_text(const char* last, std::uint32_t last_length, const char* text, std::uint32_t length) noexcept {
  if (last == nullptr || last_length != length) return false;
  for (std::uint32_t i = 0; i < length; ++i) {
    if (last[i] != text[i]) return false;
  }
  return true;
}

// One read of one pickle, on one thread but for read_trace_in_parallel(),
// which runs threads of its own and waits for them. The members the files
// define are declared inline, as they were while the class held their
// bodies: in a -fPIC build GCC inlines no other function with external
// linkage, since another library could replace it.
class Unpickler {
 public:
  inline Unpickler(std::span<const std::byte> bytes, const ParseOptions& options);
  // Reads the whole pickle. Throws SnapshotError (pickle.hpp).
  inline Tree run();

 private:
  // step(), read_trace_entry(), key_fields() and apply() have one caller
  // each. GCC inlines such a function only while it is local to its file,
  // which a member of a class that two files share is not: without the
  // attribute, step() was a call per opcode.
  [[gnu::always_inline]] inline bool step();
  [[noreturn]] inline void reject() const;
  [[noreturn]] void inconsistent(const std::string& what) const;
  [[noreturn]] inline void truncated_length(std::uint64_t wanted) const;
  inline std::size_t remaining() const noexcept;
  [[gnu::always_inline]] inline const std::byte* take(std::uint64_t length);
  [[noreturn, gnu::cold, gnu::noinline]] inline void past_end(std::uint64_t length) const;
  [[gnu::always_inline]] inline std::uint8_t read_u8();
  template <std::size_t Width>
  [[gnu::always_inline]] inline std::uint64_t read_le();

  // --- the stack ------------------------------------------------------------
  inline std::size_t floor() const noexcept;
  [[gnu::always_inline]] void push(const Value& value) {
    if (stack_.size() >= stack_.capacity()) [[unlikely]] grow_stack();
    stack_.push_back(value);
  }
  [[gnu::noinline]] void grow_stack();
  [[noreturn, gnu::noinline]] inline void too_deep() const;
  void push_container(ContainerId id) {
    Value value;
    value.kind = tree_.container(id).kind;
    value.length = id;
    push(value);
  }
  inline void push_boolean(bool flag);
  [[noreturn, gnu::cold, gnu::noinline]] inline void stack_empty() const;
  inline Value pop();
  inline const Value& top();
  inline std::size_t pop_mark();

  // --- the memo -------------------------------------------------------------
  inline void memo_put(std::uint32_t index);
  inline void memo_store(std::uint32_t index, MemoEntry entry);
  inline MemoEntry box(const Value& value);
  inline MemoEntry box_text(const char* text, std::uint32_t length);
  [[gnu::noinline]] inline void memo_store_new(std::uint32_t index, MemoEntry entry);
  [[gnu::always_inline]] inline void memo_get(std::uint32_t index);
  [[gnu::noinline]] inline MemoEntry sparse_memo_get(std::uint32_t index) const;
  [[noreturn, gnu::cold, gnu::noinline]] inline void memo_missing(std::uint32_t index) const;

  // --- containers -----------------------------------------------------------
  inline ContainerId make_container(Kind kind);
  // The Container of `id` to change in place: a whole entry's is stored
  // from then on in Tree::changed (whose references stay valid).
  Container& changeable(ContainerId id) {
    if (id < kWholeEntryDict) [[likely]]
      return tree_.containers[id];
    const Container made = tree_.container(id);
    return tree_.changed.try_emplace(id, made).first->second;
  }
  inline ContainerId expect_container(const Value& value, Kind expected);
  static inline std::size_t capacity(std::size_t size) noexcept;
  inline void append_items(ContainerId id, const Value* items, std::size_t count);
  inline void to_items(ContainerId id);
  inline std::int64_t trace_index(const Value& value) const noexcept;
  inline bool continues_run(const Value* items, std::size_t count, std::uint64_t first) const noexcept;
  inline void add_to_list(ContainerId id, const Value* items, std::size_t count);
  inline std::uint64_t intern_frame_list(const Value* items, std::size_t count);
  std::uint64_t intern_frame_list(std::span<const ContainerId> items) {
    if (tree_.frame_lists.size() >= kMaxContainers / 2) inconsistent("too many containers");
    return frame_list_table_.intern(items, tree_.frame_lists, tree_.frame_items);
  }
  inline void add_to_dict(ContainerId id, const Value* items, std::size_t count);
  inline bool update_trace_entry(Event& entry, const Value* items, std::size_t count, bool fresh);
  [[gnu::always_inline]] inline const std::int8_t* key_fields(const Value* items, std::size_t count);
  inline const TraceMeaning& meaning(const Value& text);
  inline void collect(Kind kind);
  inline void small_tuple(std::size_t count);
  inline void append();
  inline void set_item();
  inline void extend(Kind kind);

  // --- trace entries in one step -----------------------------------------------
  // Raw pointers into memo_, boxed_ and the containers: valid only until one
  // of them next grows, so take a view where it is used, never keep one.
  MemoView memo_view() const noexcept {
    return MemoView{memo_.data(), memo_count_, boxed_.data(), tree_.containers.data()};
  }
  [[gnu::always_inline]] inline bool read_trace_entry();
  [[gnu::always_inline]] inline void apply(const ScannedEntry& entry);

  // --- a long trace list on several threads ------------------------------------
  void read_trace_in_parallel();

  // --- scalars ----------------------------------------------------------------
  inline void push_integer(bool negative, std::uint64_t magnitude);
  inline void long_integer(std::uint64_t length);
  inline void push_text(Kind kind, std::uint64_t length);

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
  // in read_trace_in_parallel(), 87% of reading a 3M-event pickle of our
  // own old writer's on 2 cores). After a short try, one thread reads at
  // least the bytes it counted in vain, and a chunk's worth, before the
  // next: all tries together count at most the file once more.
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

}  // namespace cachealloc::snapshot::pickle
