// Reading one PyTorch trace entry straight from the pickle's bytes, for the
// restricted unpickler (unpickler.hpp): its one-by-one fast path and its
// parallel chunk readers both use EntryScanner.
//
// PyTorch writes millions of trace entries in one shape:
//   EMPTY_DICT MEMOIZE MARK (key value)... SETITEMS
// with BINGET keys, integer values, memoized strings and a frames list of
// BINGET frame dicts. scan() reads the opcodes after the EMPTY_DICT into a
// ScannedEntry without changing anything; the caller then applies what the
// entry memoizes, in order, exactly as running the opcodes one by one would.
// scan() answers false for anything else (a frame dict seen for the first
// time, a negative or big integer, BINPUT, a key that is no trace key, a
// repeated key, bytes running out...), and the caller runs the opcodes one
// by one instead, which handles (or rejects) every case.
//
// Cost: about 25 ns an entry of ~20 opcodes, against ~130 one by one.
// Thread safety: a scanner belongs to one thread; the memo it reads must not
// change while it reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <vector>
#include <string_view>

#include "pickle_value.hpp"

// The scanner's helpers are lambdas over its cursor; left out of line (GCC
// kept the frame loop's lambda out), the cursor and the index live on the
// stack and every opcode pays loads and stores through it.
#define CACHEALLOC_SCAN_INLINE __attribute__((always_inline))

namespace cachealloc::snapshot::pickle {

// A memo entry: the kind in the top 2 bits (0: a boxed scalar, else the
// container's kind) and a container id or boxed-scalar index below. 4 bytes,
// because PyTorch memoizes three values per trace entry, ~10M in a 3M-entry
// trace, and BINGET then needs no look at the container.
using MemoEntry = std::uint32_t;
inline constexpr MemoEntry kUnsetMemo = std::numeric_limits<MemoEntry>::max();
inline constexpr int kMemoKindShift = 30;
inline constexpr MemoEntry kMemoIndexMask = (MemoEntry{1} << kMemoKindShift) - 1;
constexpr MemoEntry memo_kind_bits(Kind kind) noexcept {
  return kind == Kind::list ? 1 : kind == Kind::tuple ? 2 : kind == Kind::dict ? 3 : 0;
}
inline constexpr Kind kMemoKinds[4] = {Kind::none, Kind::list, Kind::tuple, Kind::dict};
inline Kind memo_kind(MemoEntry entry) noexcept { return kMemoKinds[entry >> kMemoKindShift]; }

// The deepest frames list a scan takes; deeper ones go one by one.
inline constexpr std::size_t kMaxScannedFrames = 64;

// The memo as a scanner may read it: entries [0, count) are all set (every
// one was stored by MEMOIZE), and none of it changes during a scan.
struct MemoView {
  const MemoEntry* entries = nullptr;
  std::uint32_t count = 0;
  const Value* boxed = nullptr;
  const Container* containers = nullptr;  // the stored ones (ids below kWholeEntryDict)
};

// A memo reference the scanner could not follow because it points past
// MemoView::count: into memo entries a parallel reader stores later. Only
// scan(..., defer = true) leaves these; the caller follows them once the
// memo is complete.
struct DeferredRef {
  enum class Use : std::uint8_t { action, frames, any };
  Use use = Use::any;
  std::uint32_t index = 0;
  // Entries this entry memoized before the reference: an index is only
  // valid below the memo's size at that point.
  std::uint8_t memoized_before = 0;
};

struct ScannedEntry {
  enum class Memoized : std::uint8_t { dict, text, frames };
  static constexpr std::size_t kMaxMemoized = 12;
  static constexpr std::size_t kMaxDeferred = 4;

  // The TraceEntry record (pickle_value.hpp) less what the caller assigns:
  // stack (the dict's id) and, for a new frames list, thread.
  Event record;
  bool action_known = false;
  // What the entry memoizes, in order; texts are views of the input.
  Memoized memoized[kMaxMemoized];
  const char* text[kMaxMemoized];
  std::uint32_t text_length[kMaxMemoized];
  std::size_t memoized_count = 0;
  // A new frames list (Memoized::frames) holds these frame dicts.
  ContainerId frames[kMaxScannedFrames];
  std::size_t frame_count = 0;
  DeferredRef deferred[kMaxDeferred];
  std::size_t deferred_count = 0;
};

// Frame lists by content (open addressing over FrameList numbers), so a
// stack repeated a million times is stored once. Numbers follow first
// appearance.
class FrameListTable {
 public:
  // The number of the list holding `frames`, appended to `lists` and
  // `items` when new.
  std::uint64_t intern(std::span<const ContainerId> frames, std::vector<FrameList>& lists,
                       std::vector<ContainerId>& items) {
    std::uint64_t hash = 0x9e3779b97f4a7c15ull ^ frames.size();
    for (const ContainerId frame : frames) hash = (hash ^ frame) * 0xff51afd7ed558ccdull;
    hash ^= hash >> 29;
    const auto hash32 = static_cast<std::uint32_t>(hash);
    if ((lists.size() + 1) * 2 > slots_.size()) grow();
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t slot = hash32 & mask;; slot = (slot + 1) & mask) {
      const std::uint64_t entry = slots_[slot];
      if (entry == 0) {
        slots_[slot] = std::uint64_t{hash32} << 32 | (lists.size() + 1);
        lists.push_back(FrameList{items.size(), static_cast<std::uint32_t>(frames.size())});
        items.insert(items.end(), frames.begin(), frames.end());
        return lists.size() - 1;
      }
      if ((entry >> 32) != hash32) continue;
      const std::size_t number = (entry & 0xffffffffu) - 1;
      const FrameList& known = lists[number];
      if (known.size == frames.size() && same_frames(frames, items.data() + known.offset)) return number;
    }
  }

 private:
  // An inline loop: std::equal became a call to memcmp for 2 to 6 ids.
  static bool same_frames(std::span<const ContainerId> frames, const ContainerId* known) noexcept {
    for (std::size_t i = 0; i < frames.size(); ++i) {
      if (frames[i] != known[i]) return false;
    }
    return true;
  }
  void grow() {
    std::vector<std::uint64_t> slots(std::max<std::size_t>(64, slots_.size() * 2), 0);
    const std::size_t mask = slots.size() - 1;
    for (const std::uint64_t entry : slots_) {
      if (entry == 0) continue;
      std::size_t slot = (entry >> 32) & mask;
      while (slots[slot] != 0) slot = (slot + 1) & mask;
      slots[slot] = entry;
    }
    slots_ = std::move(slots);
  }

  // The low 32 bits of the list's hash above its FrameList number + 1 (0 =
  // free), so a probe reads one word: with the hashes in an array of their
  // own, a look-up touched three arrays at random before it compared a frame.
  std::vector<std::uint64_t> slots_;
};

class EntryScanner {
 public:
  // Reads the entry whose EMPTY_DICT ends at `at`, up to and including its
  // SETITEMS; on success `at` moves past it. `defer`: references past
  // memo.count are kept in out.deferred (the action, a shared frames list,
  // a compile_context or user_metadata value) instead of failing.
  bool scan(const std::uint8_t* data, std::size_t& at, std::size_t end, const MemoView& memo, bool defer,
            ScannedEntry& out) {
    std::size_t p = at;
    if (end - p < 2 || data[p] != 0x94 || data[p + 1] != 0x28) return false;  // MEMOIZE MARK
    p += 2;
    out.record = Event{};
    out.action_known = false;
    out.memoized_count = 0;
    out.frame_count = 0;
    out.deferred_count = 0;
    out.memoized[out.memoized_count++] = ScannedEntry::Memoized::dict;

    // FRAME opcodes (protocol 4+) fall between any two values.
    auto skip_frames = [&]() CACHEALLOC_SCAN_INLINE {
      while (p < end && data[p] == 0x95) {
        if (end - p < 9) return false;
        std::uint64_t length = 0;
        std::memcpy(&length, data + p + 1, 8);
        if (length > end - p - 9) return false;
        p += 9;
      }
      return p < end;
    };
    // A BINGET/LONG_BINGET; `index` is set, true when it is below memo.count.
    std::uint32_t index = 0;
    bool past = false;
    auto memo_index = [&]() CACHEALLOC_SCAN_INLINE {
      past = false;
      if (data[p] == 0x68 && end - p >= 2) {
        index = data[p + 1];
        p += 2;
      } else if (data[p] == 0x6a && end - p >= 5) {
        std::memcpy(&index, data + p + 1, 4);
        p += 5;
      } else {
        return false;
      }
      if (index < memo.count) return true;
      past = true;
      return false;
    };
    auto defer_ref = [&](DeferredRef::Use use) CACHEALLOC_SCAN_INLINE {
      if (!defer || !past || out.deferred_count == ScannedEntry::kMaxDeferred) return false;
      out.deferred[out.deferred_count++] =
          DeferredRef{use, index, static_cast<std::uint8_t>(out.memoized_count)};
      return true;
    };
    // SHORT_BINUNICODE, memoized or not.
    auto short_text = [&](const char*& text, std::uint32_t& length) CACHEALLOC_SCAN_INLINE {
      if (end - p < 2 || end - p - 2 < data[p + 1]) return false;
      length = data[p + 1];
      text = reinterpret_cast<const char*>(data + p + 2);
      p += 2 + length;
      if (p < end && data[p] == 0x94) {
        if (out.memoized_count == ScannedEntry::kMaxMemoized) return false;
        out.text[out.memoized_count] = text;
        out.text_length[out.memoized_count] = length;
        out.memoized[out.memoized_count++] = ScannedEntry::Memoized::text;
        ++p;
      }
      return true;
    };

    Event& next = out.record;
    unsigned seen = 0;  // bit 0: action, bit 1 + f: TraceField f
    for (;;) {
      if (!skip_frames()) return false;
      if (data[p] == 0x75) {  // SETITEMS
        ++p;
        break;
      }
      if (!memo_index()) return false;  // keys come before the trace: never deferred
      const int field_number = meaning_of(index, memo).key;
      if (field_number == kNotATraceKey) return false;
      const unsigned bit = 1u << (field_number + 1);
      if ((seen & bit) != 0) return false;  // a repeated key: one by one
      seen |= bit;
      if (!skip_frames()) return false;
      const std::uint8_t op = data[p];

      if (field_number == kActionKey) {
        if (op == 0x8c) {
          const char* text = nullptr;
          std::uint32_t length = 0;
          if (!short_text(text, length)) return false;
          const std::optional<EventKind> action = trace_action_of(std::string_view(text, length));
          if (!action) return false;
          next.kind = *action;
          out.action_known = true;
        } else if (memo_index()) {
          const int action = meaning_of(index, memo).action;
          if (action < 0) return false;
          next.kind = static_cast<EventKind>(action);
          out.action_known = true;
        } else if (!defer_ref(DeferredRef::Use::action)) {
          return false;
        }
        continue;
      }
      const auto field = static_cast<TraceField>(field_number);
      if (field == TraceField::compile_context || field == TraceField::user_metadata) {
        // Kept as present only, whatever the value: only its memo index is checked.
        const char* text = nullptr;
        std::uint32_t length = 0;
        if (op == 0x4e) {
          ++p;
        } else if (op == 0x8c) {
          if (!short_text(text, length)) return false;
        } else if (!memo_index() && !defer_ref(DeferredRef::Use::any)) {
          return false;
        }
        set_field_state(next, field, FieldState::none);
        continue;
      }
      if (field == TraceField::frames) {
        if (op == 0x5d) {  // EMPTY_LIST MEMOIZE, then one APPEND, a MARK ... APPENDS, or nothing
          if (end - p < 2 || data[p + 1] != 0x94 || out.memoized_count == ScannedEntry::kMaxMemoized) return false;
          p += 2;
          out.memoized[out.memoized_count++] = ScannedEntry::Memoized::frames;
          // A frame: a BINGET of a dict with items (a frame dict seen before).
          auto frame = [&]() CACHEALLOC_SCAN_INLINE {
            if (!skip_frames() || out.frame_count == kMaxScannedFrames || !memo_index()) return false;
            const RefMeaning& known = meaning_of(index, memo);
            if (!known.frame_dict) return false;
            out.frames[out.frame_count++] = known.container;
            return true;
          };
          if (!skip_frames()) return false;
          if (data[p] == 0x28) {  // MARK frame... APPENDS
            ++p;
            while (skip_frames() && data[p] != 0x65) {
              if (!frame()) return false;
            }
            if (out.frame_count == 0 || p >= end) return false;
            ++p;
          } else {
            // One frame and APPEND, or an empty list and the next key, which
            // is a BINGET too: tell them apart by the APPEND.
            const std::size_t list_end = p;
            if (!frame() || !skip_frames() || data[p] != 0x61) {
              p = list_end;
              out.frame_count = 0;
            } else {
              ++p;
            }
          }
          set_field_state(next, field, FieldState::container);
        } else if (op == 0x4e) {
          ++p;
          set_field_state(next, field, FieldState::none);
        } else if (memo_index()) {
          const MemoEntry entry = memo.entries[index];
          const Kind kind = memo_kind(entry);
          if (kind != Kind::list && kind != Kind::tuple) return false;
          next.thread = entry & kMemoIndexMask;
          set_field_state(next, field, FieldState::container);
        } else if (defer_ref(DeferredRef::Use::frames)) {
          set_field_state(next, field, FieldState::container);
        } else {
          return false;
        }
        continue;
      }
      // addr, size, stream, time_us, device_free: a non-negative integer or None.
      std::uint64_t number = 0;
      FieldState state = FieldState::integer;
      if (op == 0x8a && end - p >= 10 && data[p + 1] <= 8) {  // LONG1, with 8 bytes to load
        const unsigned length = data[p + 1];
        std::uint64_t word = 0;
        std::memcpy(&word, data + p + 2, 8);
        number = length == 8 ? word : word & ((std::uint64_t{1} << (8 * length)) - 1);
        if (length != 0 && (number >> (8 * length - 1)) != 0) return false;  // negative
        p += 2 + length;
      } else if (op == 0x4b && end - p >= 2) {  // BININT1
        number = data[p + 1];
        p += 2;
      } else if (op == 0x4d && end - p >= 3) {  // BININT2
        number = std::uint64_t{data[p + 1]} | std::uint64_t{data[p + 2]} << 8;
        p += 3;
      } else if (op == 0x4a && end - p >= 5 && data[p + 4] < 0x80) {  // BININT, non-negative
        std::uint32_t value = 0;
        std::memcpy(&value, data + p + 1, 4);
        number = value;
        p += 5;
      } else if (op == 0x4e) {  // NONE
        ++p;
        state = FieldState::none;
      } else {
        return false;  // the rest (LONG1 near the end, negative...) one by one
      }
      trace_slot(next, field) = number;
      set_field_state(next, field, state);
    }
    if ((seen & 1u) == 0) return false;  // no action: a plain dict
    at = p;
    return true;
  }

 private:
  // What a memo entry means to an entry, cached by memo index: 9 keys an
  // entry resolve without following memo -> box -> text each time. Sound
  // because a memo stored by MEMOIZE alone never changes a stored entry.
  struct RefMeaning {
    std::uint32_t index_plus_one = 0;  // 0: empty slot
    std::int8_t key = kNotATraceKey;
    std::int8_t action = -1;
    bool frame_dict = false;  // a dict with items: what a frames list holds
    ContainerId container = 0;
  };
  // The hit inline (about 13 look-ups an entry; out of line, the calls were
  // a quarter of the scan's instructions), the miss out of line.
  CACHEALLOC_SCAN_INLINE const RefMeaning& meaning_of(std::uint32_t index, const MemoView& memo) {
    RefMeaning& slot = cache_[(index * 0x9e3779b1u) >> 22];
    if (slot.index_plus_one == index + 1) [[likely]]
      return slot;
    return meaning_missed(slot, index, memo);
  }
  [[gnu::noinline]] const RefMeaning& meaning_missed(RefMeaning& slot, std::uint32_t index, const MemoView& memo) {
    RefMeaning fresh;
    const MemoEntry entry = memo.entries[index];
    if ((entry >> kMemoKindShift) == 0) {
      const Value& value = memo.boxed[entry];
      if (value.kind == Kind::text) {
        fresh.key = static_cast<std::int8_t>(trace_key_of(value.view()));
        const std::optional<EventKind> action = trace_action_of(value.view());
        fresh.action = action ? static_cast<std::int8_t>(*action) : std::int8_t{-1};
      }
    } else if (memo_kind(entry) == Kind::dict) {
      const ContainerId id = entry & kMemoIndexMask;
      // Another entry's dict is never a frame: the scan stops, and the
      // opcodes one by one say what it is.
      if (id >= kWholeEntryDict) {
        fresh.index_plus_one = index + 1;
        slot = fresh;
        return slot;
      }
      const Container& c = memo.containers[id];
      fresh.frame_dict = c.shape == Shape::items;
      fresh.container = id;
      // An empty dict may still become a TraceEntry: look again next time.
      if (c.size == 0) return uncached_ = fresh;
    }
    fresh.index_plus_one = index + 1;
    slot = fresh;
    return slot;
  }

  RefMeaning cache_[1024];
  RefMeaning uncached_;
};

}  // namespace cachealloc::snapshot::pickle
