#include "event_codec.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstring>
#include <string>
#include <unordered_map>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/detail/flat_map.hpp"
#include "huge_pages.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

// The encoder and the decoder run the same predictor over the events they
// have seen so far, so both sides agree on every prediction without storing
// it. Bit layouts are in docs/FORMAT.md; keep the two in step.
//
// Encoding 3 is what we write. Encodings 1 and 2 are only read: their
// decoders are kept as they were when format versions 1 and 2-5 were
// current, and must not change, or those files would read differently.

namespace cachealloc::snapshot::detail {
namespace {

// Block sizes and addresses are multiples of 512 in the caching allocator;
// dividing first saves 9 bits, about one varint byte, per value.
constexpr unsigned kAlignShift = 9;
constexpr std::uint64_t kAlignMask = (std::uint64_t{1} << kAlignShift) - 1;

std::uint64_t zigzag(std::int64_t value) {
  return (static_cast<std::uint64_t>(value) << 1) ^ static_cast<std::uint64_t>(value >> 63);
}
std::int64_t unzigzag(std::uint64_t value) {
  return static_cast<std::int64_t>(value >> 1) ^ -static_cast<std::int64_t>(value & 1);
}

std::size_t varint_length(std::uint64_t value) {
  std::size_t length = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++length;
  }
  return length;
}

void put_varint(std::vector<std::uint8_t>& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<std::uint8_t>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<std::uint8_t>(value));
}

// Little-endian bytes as loaded from memory, on any host.
std::uint64_t le64(std::uint64_t loaded) {
  if constexpr (std::endian::native == std::endian::big) return __builtin_bswap64(loaded);
  return loaded;
}

// The payload bits of a varint of up to 8 bytes, already cut after its last
// byte, side by side: PEXT with 0x7f in every byte, one instruction where the
// portable merge is six. As inline assembly so that no function needs a
// target attribute: only the decoder that varint_pext() picked runs it.
#if defined(__x86_64__)
inline std::uint64_t gather_payload_pext(std::uint64_t cut) {
  std::uint64_t out;
  asm("pextq %2, %1, %0" : "=r"(out) : "r"(cut), "r"(std::uint64_t{0x7f7f7f7f7f7f7f7full}));
  return out;
}
#else
inline std::uint64_t gather_payload_pext(std::uint64_t) { __builtin_unreachable(); }
#endif

// Whether this CPU's PEXT is fast: BMI2 on Intel, or on AMD from family 0x19
// (Zen 3); Zen 1 and 2 (family 0x17) run it in microcode, hundreds of cycles.
bool pext_is_fast() noexcept {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  if ((ebx & (1u << 8)) == 0) return false;  // BMI2
  __cpuid(0, eax, ebx, ecx, edx);
  const bool intel = ebx == 0x756e6547 && edx == 0x49656e69 && ecx == 0x6c65746e;  // "GenuineIntel"
  if (intel) return true;
  __cpuid(1, eax, ebx, ecx, edx);
  unsigned family = (eax >> 8) & 0xf;
  if (family == 0xf) family += (eax >> 20) & 0xff;
  return family >= 0x19;
#else
  return false;
#endif
}

std::atomic<bool> g_varint_pext{pext_is_fast()};

[[noreturn, gnu::cold, gnu::noinline]] void fail(const std::string& what) {
  throw SnapshotError(ErrorCode::inconsistent, "inconsistent snapshot: " + what);
}
[[noreturn, gnu::cold, gnu::noinline]] void fail_at(std::uint64_t event, const std::string& what) {
  fail("event " + std::to_string(event) + " " + what);
}

class ColumnReader {
 public:
  ColumnReader(const std::vector<std::uint8_t>& bytes, const char* name)
      : data_(bytes.data()), size_(bytes.size()), fast_end_(size_ >= 10 ? size_ - 9 : 0), name_(name) {}

  std::uint8_t byte(std::uint64_t event) {
    if (position_ == size_) [[unlikely]]
      ends_early(event);
    return data_[position_++];
  }
  // Inline: with 10 bytes left no bound check can fail, and a varint of up
  // to 8 bytes (56 bits: every time delta, address delta and size we have
  // seen) is one load and a few shifts. Encoding 3 stores 3-4 byte address
  // deltas, which were a call each out of line. The rest, and the last
  // bytes of a column, go the careful way below.
  // The bound is one compare against fast_end_, and the mask and the first
  // merge step are 3 operations fewer than the general form in long_varint:
  // the decoder reads about two varints per event (session 10).
  //
  // kPext: the merge is one PEXT (gather_payload_pext), for the decoder
  // varint_pext() picked; the values are the same.
  template <bool kPext = false>
  std::uint64_t varint(std::uint64_t event) {
    if (position_ < fast_end_) [[likely]] {
      std::uint64_t word;
      std::memcpy(&word, data_ + position_, sizeof word);
      word = le64(word);
      if ((word & 0x80) == 0) {
        ++position_;
        return word & 0x7f;
      }
      if (const std::uint64_t stops = ~word & 0x8080808080808080ull; stops != 0) [[likely]] {
        const auto last_bit = static_cast<unsigned>(std::countr_zero(stops));  // 8 * (length - 1) + 7
        position_ += (last_bit + 1) / 8;
        if constexpr (kPext) return gather_payload_pext(word & (~std::uint64_t{0} >> (63 - last_bit)));
        std::uint64_t x = word & (~std::uint64_t{0} >> (63 - last_bit)) & 0x7f7f7f7f7f7f7f7full;
        x -= (x & 0x7f007f007f007f00ull) >> 1;  // each 16-bit lane: low + 128 * high
        x = ((x & 0x3fff00003fff0000ull) >> 2) | (x & 0x00003fff00003fffull);
        x = ((x & 0x0fffffff00000000ull) >> 4) | (x & 0x000000000fffffffull);
        return x;
      }
      return long_varint(event);
    }
    if (position_ + 1 < size_) {
      const std::uint8_t first = data_[position_];
      if (first < 0x80) {
        ++position_;
        return first;
      }
      const std::uint8_t second = data_[position_ + 1];
      if (second < 0x80) {
        position_ += 2;
        return (first & 0x7fu) | (std::uint64_t{second} << 7);
      }
    } else if (position_ < size_ && data_[position_] < 0x80) {
      return data_[position_++];
    }
    return long_varint(event);
  }
  void expect_consumed() const {
    if (position_ != size_) {
      fail("the " + std::string(name_) + " column has " + std::to_string(size_ - position_) +
           " bytes after the last event");
    }
  }

 private:
  [[gnu::noinline]] std::uint64_t long_varint(std::uint64_t event) {
    // With 10 bytes left no bound check can fail. A varint of up to 8 bytes
    // (56 bits: every time delta and address we have seen) is one load and a
    // few shifts instead of a loop.
    if (size_ - position_ >= 10) {
      std::uint64_t word;
      std::memcpy(&word, data_ + position_, sizeof word);
      word = le64(word);
      if (const std::uint64_t stops = ~word & 0x8080808080808080ull; stops != 0) {
        const auto last_bit = static_cast<unsigned>(std::countr_zero(stops));  // 8 * (length - 1) + 7
        std::uint64_t x = last_bit == 63 ? word : word & ((std::uint64_t{1} << (last_bit + 1)) - 1);
        x &= 0x7f7f7f7f7f7f7f7full;
        x = ((x & 0x7f007f007f007f00ull) >> 1) | (x & 0x007f007f007f007full);
        x = ((x & 0x3fff00003fff0000ull) >> 2) | (x & 0x00003fff00003fffull);
        x = ((x & 0x0fffffff00000000ull) >> 4) | (x & 0x000000000fffffffull);
        position_ += (last_bit + 1) / 8;
        return x;
      }
      // 9 or 10 bytes, or too long: byte by byte.
      const std::uint8_t* at = data_ + position_;
      std::uint64_t value = 0;
      for (unsigned i = 0; i < 10; ++i) {
        const std::uint8_t next = at[i];
        if (i == 9 && next > 1) break;
        value |= static_cast<std::uint64_t>(next & 0x7f) << (7 * i);
        if ((next & 0x80) == 0) {
          position_ += i + 1;
          return value;
        }
      }
      position_ += 10;  // where the bounded loop below would stop
      fail_at(event, "has a varint longer than 64 bits in the " + std::string(name_) + " column");
    }
    std::uint64_t value = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
      const std::uint8_t next = byte(event);
      if (shift == 63 && next > 1) break;
      value |= static_cast<std::uint64_t>(next & 0x7f) << shift;
      if ((next & 0x80) == 0) return value;
    }
    fail_at(event, "has a varint longer than 64 bits in the " + std::string(name_) + " column");
  }
  [[noreturn, gnu::cold, gnu::noinline]] void ends_early(std::uint64_t event) const {
    fail("the " + std::string(name_) + " column ends before event " + std::to_string(event));
  }

  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t fast_end_;  // below it, 10 bytes remain
  const char* name_;
  std::size_t position_ = 0;
};

// All eight columns, read in step.
struct ColumnReaders {
  explicit ColumnReaders(const EventColumns& columns)
      : context(columns.context, "context"),
        time(columns.time, "time"),
        address(columns.address, "address"),
        detail(columns.detail, "detail"),
        stack(columns.stack, "stack"),
        size(columns.size, "size"),
        aux(columns.aux, "aux") {}
  void expect_consumed() const {
    context.expect_consumed();
    time.expect_consumed();
    address.expect_consumed();
    detail.expect_consumed();
    stack.expect_consumed();
    size.expect_consumed();
    aux.expect_consumed();
  }
  ColumnReader context, time, address, detail, stack, size, aux;
};

template <bool kPext = false>
StackId read_stack_id(ColumnReader& column, std::uint64_t event) {
  const std::uint64_t stack = column.template varint<kPext>(event);
  if (stack > UINT32_MAX) fail_at(event, "has a stack id past 32 bits");
  return StackId{static_cast<std::uint32_t>(stack)};
}

struct Remembered {
  std::uint64_t size = 0;
  std::uint64_t aux = 0;
  StackId stack{};
};

// A move-to-front list of the last N distinct values, most recent first.
// Bounded: N steps per lookup, whatever the input.
template <class T, std::size_t N>
class RecentList {
 public:
  static constexpr std::size_t kMissing = N;
  std::size_t size() const noexcept { return count_; }
  const T& operator[](std::size_t index) const noexcept { return values_[index]; }
  std::size_t find(const T& value) const noexcept {
    // Four at a time, one branch per four: about half the instructions.
    std::size_t i = 0;
    for (; i + 4 <= count_; i += 4) {
      const unsigned hits = static_cast<unsigned>(values_[i] == value) | static_cast<unsigned>(values_[i + 1] == value) |
                            static_cast<unsigned>(values_[i + 2] == value) | static_cast<unsigned>(values_[i + 3] == value);
      if (hits != 0) break;
    }
    for (; i < count_; ++i) {
      if (values_[i] == value) return i;
    }
    return kMissing;
  }
  // `listed_at`: where the caller already knows the value is, else kMissing.
  void touch(const T& value, std::size_t listed_at = kMissing) noexcept {
    // Often the value is already first: the same address or stack again.
    if (count_ != 0 && values_[0] == value) return;
    std::size_t at = listed_at != kMissing ? listed_at : find(value);
    if (at == kMissing) at = count_ < N ? count_++ : N - 1;
    std::copy_backward(values_.begin(), values_.begin() + static_cast<std::ptrdiff_t>(at),
                       values_.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    values_[0] = value;
  }

 private:
  std::array<T, N> values_{};
  std::size_t count_ = 0;
};

// ===========================================================================
// Encoding 1 (format version 1): read only. Frozen.
// ===========================================================================
namespace v1 {

constexpr std::uint8_t kKindMask = 0x0f;
constexpr std::uint8_t kContextChanged = 0x10;
constexpr unsigned kAddressModeShift = 5;
constexpr std::uint8_t kFromLiveBlock = 0x80;

enum AddressMode : std::uint8_t { address_same = 0, address_recent = 1, address_aligned_delta = 2, address_raw_delta = 3 };
constexpr std::size_t kRecentAddresses = 64;

constexpr std::uint8_t kThreadChanged = 0x01;
constexpr std::uint8_t kDeviceChanged = 0x02;
constexpr std::uint8_t kStreamChanged = 0x04;

enum StackMode : std::uint8_t { stack_none = 0, stack_previous = 1, stack_explicit = 2 };
enum SizeMode : std::uint8_t {
  size_predicted = 0,
  size_zero = 1,
  size_aligned = 2,
  size_raw = 3,
  size_previous = 4,
  size_grown = 5,
};
constexpr std::uint8_t kSizeModeCount = 6;
enum AuxMode : std::uint8_t {
  aux_predicted = 0,
  aux_zero = 1,
  aux_below_size = 2,
  aux_aligned = 3,
  aux_raw = 4,
  aux_growth = 5,
  aux_previous_size = 6,
};
constexpr std::uint8_t kAuxModeCount = 7;
constexpr unsigned kSizeModeShift = 2;
constexpr unsigned kAuxModeShift = 5;

struct Predictor {
  std::uint32_t thread = 0;
  std::int32_t device = 0;
  std::uint64_t stream = 0;
  std::uint64_t time_ns = 0;
  std::uint64_t last_address = 0;
  std::uint64_t last_size = 0;
  StackId last_stack{};
  RecentList<std::uint64_t, kRecentAddresses> recent;
  std::unordered_map<std::uint64_t, Remembered> live;
  std::unordered_map<std::uint64_t, Remembered> by_site;

  static std::uint64_t site_key(StackId stack, std::uint8_t kind) {
    return (static_cast<std::uint64_t>(stack.value) << 4) | kind;
  }
  Remembered site(StackId stack, std::uint8_t kind) const {
    const auto found = by_site.find(site_key(stack, kind));
    return found == by_site.end() ? Remembered{} : found->second;
  }
  const Remembered* live_block(std::uint64_t address) const {
    const auto found = live.find(address);
    return found == live.end() ? nullptr : &found->second;
  }
  void learn(const Event& event, std::uint8_t kind, bool used_detail) {
    thread = event.thread;
    device = event.device;
    stream = event.stream;
    time_ns = event.time_ns;
    if (event.address != 0) {
      last_address = event.address;
      recent.touch(event.address);
    }
    last_size = event.size;
    last_stack = event.stack;
    if (used_detail) by_site[site_key(event.stack, kind)] = Remembered{event.size, event.aux, event.stack};
    if (kind == static_cast<std::uint8_t>(EventKind::alloc)) {
      live[event.address] = Remembered{event.size, event.aux, event.stack};
    } else if (kind == static_cast<std::uint8_t>(EventKind::free_completed)) {
      live.erase(event.address);
    }
  }
};

void decode(const EventColumns& columns, std::vector<Event>& events) {
  ColumnReaders read(columns);
  events.clear();
  events.reserve(columns.flags.size());
  Predictor predictor;
  for (std::uint64_t index = 0; index < columns.count; ++index) {
    const std::uint8_t flags = columns.flags[index];
    const auto kind = static_cast<std::uint8_t>(flags & kKindMask);
    Event event;
    event.kind = static_cast<EventKind>(kind);  // validate() rejects kinds past the last one
    event.thread = predictor.thread;
    event.device = predictor.device;
    event.stream = predictor.stream;

    if (flags & kContextChanged) {
      const std::uint8_t context = read.context.byte(index);
      if (context == 0 || (context & ~(kThreadChanged | kDeviceChanged | kStreamChanged)) != 0) {
        fail_at(index, "has an invalid context byte " + std::to_string(context));
      }
      if (context & kThreadChanged) {
        const std::uint64_t thread = read.context.varint(index);
        if (thread > UINT32_MAX) fail_at(index, "has a thread index past 32 bits");
        event.thread = static_cast<std::uint32_t>(thread);
      }
      if (context & kDeviceChanged) {
        const std::int64_t device = unzigzag(read.context.varint(index));
        if (device < INT32_MIN || device > INT32_MAX) fail_at(index, "has a device index past 32 bits");
        event.device = static_cast<std::int32_t>(device);
      }
      if (context & kStreamChanged) event.stream = read.context.varint(index);
    }

    event.time_ns = predictor.time_ns + read.time.varint(index);

    switch (static_cast<AddressMode>((flags >> kAddressModeShift) & 0x3)) {
      case address_same: event.address = predictor.last_address; break;
      case address_recent: {
        const std::uint64_t recent = read.address.varint(index);
        if (recent >= predictor.recent.size()) {
          fail_at(index, "names recent address " + std::to_string(recent) + " of " +
                             std::to_string(predictor.recent.size()));
        }
        event.address = predictor.recent[recent];
        break;
      }
      case address_aligned_delta:
        event.address =
            predictor.last_address + (static_cast<std::uint64_t>(unzigzag(read.address.varint(index))) << kAlignShift);
        break;
      case address_raw_delta:
        event.address = predictor.last_address + static_cast<std::uint64_t>(unzigzag(read.address.varint(index)));
        break;
    }

    const bool from_live_block = (flags & kFromLiveBlock) != 0;
    if (from_live_block) {
      const Remembered* block = predictor.live_block(event.address);
      if (block == nullptr) fail_at(index, "repeats a live block but none is at its address");
      event.size = block->size;
      event.aux = block->aux;
      event.stack = block->stack;
    } else {
      const std::uint8_t detail = read.detail.byte(index);
      switch (detail & 0x3) {
        case stack_none: event.stack = StackId{}; break;
        case stack_previous: event.stack = predictor.last_stack; break;
        case stack_explicit: event.stack = read_stack_id(read.stack, index); break;
        default: fail_at(index, "has an invalid stack mode");
      }
      const Remembered site = predictor.site(event.stack, kind);
      const auto size_mode = static_cast<std::uint8_t>((detail >> kSizeModeShift) & 0x7);
      const auto aux_mode = static_cast<std::uint8_t>(detail >> kAuxModeShift);
      if (size_mode >= kSizeModeCount || aux_mode >= kAuxModeCount) {
        fail_at(index, "has an invalid detail byte " + std::to_string(detail));
      }
      switch (size_mode) {
        case size_predicted: event.size = site.size; break;
        case size_zero: event.size = 0; break;
        case size_aligned: event.size = read.size.varint(index) << kAlignShift; break;
        case size_raw: event.size = read.size.varint(index); break;
        case size_previous: event.size = predictor.last_size; break;
        case size_grown: event.size = predictor.last_size + (read.size.varint(index) << kAlignShift); break;
      }
      switch (aux_mode) {
        case aux_predicted: event.aux = site.aux; break;
        case aux_zero: event.aux = 0; break;
        case aux_below_size: event.aux = event.size - read.aux.varint(index); break;
        case aux_aligned: event.aux = read.aux.varint(index) << kAlignShift; break;
        case aux_raw: event.aux = read.aux.varint(index); break;
        case aux_growth: event.aux = event.size - predictor.last_size; break;
        case aux_previous_size: event.aux = predictor.last_size; break;
      }
    }
    predictor.learn(event, kind, !from_live_block);
    events.push_back(event);
  }
  read.expect_consumed();
}

}  // namespace v1

// ===========================================================================
// Encoding 2 (format versions 2 to 5): read, and written only on request
// (encode_events(events, 2): tests and benchmarks).
// ===========================================================================
namespace v2 {

// Flag byte: kind in bits 0-3, or kContextEscape when the event's context
// changed (the kind then moves to the context byte); bit 4 = same time as the
// previous event; bits 5-6 address mode; bit 7 = no detail byte, every
// field as predicted.
constexpr std::uint8_t kKindMask = 0x0f;
constexpr std::uint8_t kContextEscape = 0x0f;
constexpr std::uint8_t kSameTime = 0x10;
constexpr unsigned kAddressModeShift = 5;
constexpr std::uint8_t kPredicted = 0x80;

enum AddressMode : std::uint8_t {
  address_same = 0,           // the last non-zero address
  address_recent = 1,         // an index into the recently used addresses
  address_aligned_delta = 2,  // zigzag((address - last) / 512)
  address_raw_delta = 3,      // zigzag(address - last)
};
// Addresses spread over gigabytes, so a delta costs 3-4 bytes; but a free
// names a block allocated a few events ago, and an alloc from the cache
// reuses a block freed a few events ago. A move-to-front list of the last 64
// addresses turns those into one byte, at a bounded 64 steps per event.
constexpr std::size_t kRecentAddresses = 64;

// Context byte (context column), after a kContextEscape flag byte: the kind
// in bits 0-3, then which of thread, device, stream changed; their new values
// follow as varints.
constexpr std::uint8_t kThreadChanged = 0x10;
constexpr std::uint8_t kDeviceChanged = 0x20;
constexpr std::uint8_t kStreamChanged = 0x40;

// Detail byte: stack mode in bits 0-1, size mode in bits 2-4, aux mode in
// bits 5-7. All zero means "as predicted", and is then not stored at all
// (kPredicted in the flag byte).
enum StackMode : std::uint8_t {
  stack_predicted = 0,  // Predictor::predicted_stack
  stack_none = 1,
  stack_recent = 2,    // varint index into the recently used stacks
  stack_explicit = 3,  // varint stack id
};
// A program has thousands of stacks; ids past 127 cost two varint bytes, a
// recent index one. 64 is the same bound as for addresses.
constexpr std::size_t kRecentStacks = 64;
enum SizeMode : std::uint8_t {
  size_predicted = 0,   // Predictor::predicted_size
  size_zero = 1,
  size_aligned = 2,     // varint * 512
  size_raw = 3,         // varint
  size_previous = 4,    // the previous event's size
  size_grown = 5,       // the previous event's size + 512 * varint
  size_free_block = 6,  // the whole cached block at the address
  size_site = 7,        // the size this (stack, kind) had last time
};
enum AuxMode : std::uint8_t {
  aux_predicted = 0,      // Predictor::predicted_aux
  aux_zero = 1,
  aux_below_size = 2,     // size - varint: requested bytes just under the block size
  aux_aligned = 3,        // varint * 512
  aux_raw = 4,            // varint
  aux_growth = 5,         // size - the previous event's size: the bytes a merge absorbed
  aux_previous_size = 6,  // the previous event's size: a merge into the block before
  aux_site = 7,           // the aux this (stack, kind) had last time
};
constexpr unsigned kSizeModeShift = 2;
constexpr unsigned kAuxModeShift = 5;

constexpr auto kAlloc = static_cast<std::uint8_t>(EventKind::alloc);
constexpr auto kFreeCompleted = static_cast<std::uint8_t>(EventKind::free_completed);
constexpr auto kSplit = static_cast<std::uint8_t>(EventKind::split);
constexpr auto kMerge = static_cast<std::uint8_t>(EventKind::merge);
constexpr auto kSegmentAlloc = static_cast<std::uint8_t>(EventKind::segment_alloc);
constexpr auto kSegmentRelease = static_cast<std::uint8_t>(EventKind::segment_release);

// Where the predicted stack of a kind comes from: whichever was right the
// last time it changed. The recorder's frees carry no stack (the same as the
// last free), a PyTorch trace's frees repeat their block's, and a split or
// merge shares its allocator call with the event before it.
enum StackSource : std::uint8_t { from_same_kind = 0, from_previous_event = 1, from_live_block = 2 };

// What both sides know before each event.
struct Predictor {
  std::uint32_t thread = 0;
  std::int32_t device = 0;
  std::uint64_t stream = 0;
  std::uint64_t time_ns = 0;
  std::uint64_t last_address = 0;
  std::uint64_t last_size = 0;
  StackId previous_stack{};
  std::array<StackId, 16> stack_of_kind{};
  std::array<StackSource, 16> stack_source{};
  RecentList<std::uint64_t, kRecentAddresses> recent_addresses;
  RecentList<StackId, kRecentStacks> recent_stacks;
  // The decoder's hints to learn(): where this event's address and stack
  // sit in the recent lists when it read them from there, else kMissing.
  std::size_t address_listed_at = decltype(recent_addresses)::kMissing;
  std::size_t stack_listed_at = decltype(recent_stacks)::kMissing;
  // Live blocks by address, filled by alloc and emptied by free_completed: the
  // free_* events of a block repeat its alloc's size and aux.
  FlatMap<Remembered> live;
  // Cached (free) blocks by address, as the events say the allocator split
  // and merged them: a split leaves the rest of the block, a merge adds a
  // neighbour. Stale entries cost compression, never correctness.
  FlatMap<std::uint64_t> free_blocks;
  // (stack, kind) -> the size and aux it had last time: one call site tends
  // to ask for the same tensor shape every iteration.
  FlatMap<Remembered> by_site;

  static std::uint64_t site_key(StackId stack, std::uint8_t kind) {
    return (static_cast<std::uint64_t>(stack.value) << 4) | kind;
  }
  // The entry of (stack, kind), added as Remembered{} (what a missing one
  // reads as) when absent, so that learn() updates it without a second
  // lookup. Valid until learn(), which alone changes by_site.
  Remembered& site(StackId stack, std::uint8_t kind) { return by_site.find_or_insert(site_key(stack, kind)); }
  // Valid until `live` changes, which learn() does last.
  const Remembered* live_block(std::uint64_t address) const { return live.find(address); }
  std::uint64_t free_block(std::uint64_t address) const {
    const std::uint64_t* found = free_blocks.find(address);
    return found == nullptr ? 0 : *found;
  }

  StackId predicted_stack(std::uint8_t kind, const Remembered* block) const {
    switch (stack_source[kind]) {
      case from_previous_event: return previous_stack;
      case from_live_block:
        if (block != nullptr) return block->stack;
        break;
      case from_same_kind: break;
    }
    return stack_of_kind[kind];
  }
  // A free repeats its live block; a merge joins the block of the event
  // before it with a cached neighbour (after it when the address stayed,
  // else the one at the new address, before it); anything else repeats its
  // call site.
  std::uint64_t predicted_size(std::uint8_t kind, std::uint64_t address, const Remembered* block,
                               const Remembered& at_site) const {
    if (block != nullptr) return block->size;
    if (kind == kMerge) {
      return address == last_address ? last_size + free_block(last_address + last_size)
                                     : free_block(address) + last_size;
    }
    return at_site.size;
  }
  // A split hands out the front of the cached block and keeps the rest.
  std::uint64_t predicted_aux(std::uint8_t kind, std::uint64_t address, std::uint64_t size, const Remembered* block,
                              const Remembered& at_site) const {
    if (block != nullptr) return block->aux;
    if (kind == kMerge) return size - last_size;
    if (kind == kSplit) return free_block(address) - size;
    return at_site.aux;
  }

  // `block` is live_block(event.address) and `at_site` site(event.stack,
  // kind), both looked up before this event.
  // Inline into the encoder's and the decoder's loops: a call per event was
  // ~20 of the decoder's instructions per event.
  [[gnu::always_inline]] void learn(const Event& event, std::uint8_t kind, const Remembered* block,
                                    Remembered& at_site) {
    if (predicted_stack(kind, block) != event.stack) {
      if (stack_of_kind[kind] == event.stack) {
        stack_source[kind] = from_same_kind;
      } else if (previous_stack == event.stack) {
        stack_source[kind] = from_previous_event;
      } else if (block != nullptr && block->stack == event.stack) {
        stack_source[kind] = from_live_block;
      }
    }
    stack_of_kind[kind] = event.stack;
    previous_stack = event.stack;
    if (event.stack) recent_stacks.touch(event.stack, stack_listed_at);
    stack_listed_at = decltype(recent_stacks)::kMissing;

    thread = event.thread;
    device = event.device;
    stream = event.stream;
    time_ns = event.time_ns;
    if (event.address != 0) {
      last_address = event.address;
      recent_addresses.touch(event.address, address_listed_at);
    }
    address_listed_at = decltype(recent_addresses)::kMissing;
    last_size = event.size;
    if (block == nullptr) at_site = Remembered{event.size, event.aux, event.stack};

    // Each event adds at most one entry to each map: memory stays O(count).
    // `block` points into `live`: it is not used past this line.
    switch (kind) {
      case kAlloc:
        live.insert(event.address, Remembered{event.size, event.aux, event.stack});
        free_blocks.erase(event.address);
        break;
      case kFreeCompleted:
        live.erase(event.address);
        free_blocks.insert(event.address, event.size);
        break;
      case kSplit:
        free_blocks.erase(event.address);
        free_blocks.insert(event.address + event.size, event.aux);
        break;
      case kMerge:
        // The absorbed neighbour starts inside the merged block, at one of
        // these two offsets depending on which side it was on.
        if (event.aux != 0 && event.aux != event.size) {
          free_blocks.erase(event.address + event.aux);
          free_blocks.erase(event.address + event.size - event.aux);
        }
        free_blocks.insert(event.address, event.size);
        break;
      case kSegmentAlloc: free_blocks.insert(event.address, event.size); break;
      case kSegmentRelease: free_blocks.erase(event.address); break;
      default: break;
    }
  }
};

EventColumns encode(std::span<const Event> events) {
  EventColumns columns;
  columns.encoding = 2;
  columns.count = events.size();
  columns.flags.reserve(events.size());
  Predictor predictor;
  for (const Event& event : events) {
    const auto kind = static_cast<std::uint8_t>(static_cast<std::uint8_t>(event.kind) & kKindMask);
    std::uint8_t flags = kind;

    std::uint8_t context = 0;
    if (event.thread != predictor.thread) context |= kThreadChanged;
    if (event.device != predictor.device) context |= kDeviceChanged;
    if (event.stream != predictor.stream) context |= kStreamChanged;
    if (context != 0) {
      flags = kContextEscape;
      columns.context.push_back(context | kind);
      if (context & kThreadChanged) put_varint(columns.context, event.thread);
      if (context & kDeviceChanged) put_varint(columns.context, zigzag(event.device));
      if (context & kStreamChanged) put_varint(columns.context, event.stream);
    }

    // One allocator call stamps all its events with one clock read, so a
    // zero delta is the common case and costs no byte. Wrapping difference:
    // time never decreases in a recorded ring, but any valid Snapshot must
    // survive, and a wrapped delta decodes exactly.
    if (event.time_ns == predictor.time_ns) {
      flags |= kSameTime;
    } else {
      put_varint(columns.time, event.time_ns - predictor.time_ns);
    }

    AddressMode address_mode = address_same;
    if (event.address != predictor.last_address) {
      const std::uint64_t delta = event.address - predictor.last_address;
      std::uint64_t value = zigzag(static_cast<std::int64_t>(delta));
      address_mode = address_raw_delta;
      if ((delta & kAlignMask) == 0) {
        address_mode = address_aligned_delta;
        value = zigzag(static_cast<std::int64_t>(delta) >> kAlignShift);
      }
      if (const std::size_t recent = predictor.recent_addresses.find(event.address);
          recent != decltype(predictor.recent_addresses)::kMissing && varint_length(recent) < varint_length(value)) {
        address_mode = address_recent;
        value = recent;
      }
      put_varint(columns.address, value);
    }
    flags |= static_cast<std::uint8_t>(address_mode << kAddressModeShift);

    const Remembered* block = predictor.live_block(event.address);

    std::uint8_t detail = 0;
    if (event.stack != predictor.predicted_stack(kind, block)) {
      if (!event.stack) {
        detail |= stack_none;
      } else if (const std::size_t recent = predictor.recent_stacks.find(event.stack);
                 recent != decltype(predictor.recent_stacks)::kMissing &&
                 varint_length(recent) < varint_length(event.stack.value)) {
        detail |= stack_recent;
        put_varint(columns.stack, recent);
      } else {
        detail |= stack_explicit;
        put_varint(columns.stack, event.stack.value);
      }
    }

    Remembered& at_site = predictor.site(event.stack, kind);
    const Remembered site = at_site;
    SizeMode size_mode = size_raw;
    if (event.size == predictor.predicted_size(kind, event.address, block, site)) {
      size_mode = size_predicted;
    } else if (event.size == 0) {
      size_mode = size_zero;
    } else if (event.size == predictor.last_size) {
      size_mode = size_previous;
    } else if (event.size == predictor.free_block(event.address)) {
      size_mode = size_free_block;
    } else if (event.size == site.size) {
      size_mode = size_site;
    } else {
      std::uint64_t value = event.size;
      if ((event.size & kAlignMask) == 0 && varint_length(event.size >> kAlignShift) < varint_length(value)) {
        size_mode = size_aligned;
        value = event.size >> kAlignShift;
      }
      const std::uint64_t growth = event.size - predictor.last_size;
      if (event.size > predictor.last_size && (growth & kAlignMask) == 0 &&
          varint_length(growth >> kAlignShift) < varint_length(value)) {
        size_mode = size_grown;
        value = growth >> kAlignShift;
      }
      put_varint(columns.size, value);
    }
    detail |= static_cast<std::uint8_t>(size_mode << kSizeModeShift);

    AuxMode aux_mode = aux_raw;
    std::uint64_t aux_value = event.aux;
    if (event.aux == predictor.predicted_aux(kind, event.address, event.size, block, site)) {
      aux_mode = aux_predicted;
    } else if (event.aux == 0) {
      aux_mode = aux_zero;
    } else if (event.aux == event.size - predictor.last_size) {
      aux_mode = aux_growth;
    } else if (event.aux == predictor.last_size) {
      aux_mode = aux_previous_size;
    } else if (event.aux == site.aux) {
      aux_mode = aux_site;
    } else {
      std::size_t best = varint_length(event.aux);
      if ((event.aux & kAlignMask) == 0 && varint_length(event.aux >> kAlignShift) < best) {
        aux_mode = aux_aligned;
        aux_value = event.aux >> kAlignShift;
        best = varint_length(aux_value);
      }
      if (event.aux <= event.size && varint_length(event.size - event.aux) < best) {
        aux_mode = aux_below_size;
        aux_value = event.size - event.aux;
      }
    }
    if (aux_mode == aux_below_size || aux_mode == aux_aligned || aux_mode == aux_raw) {
      put_varint(columns.aux, aux_value);
    }
    detail |= static_cast<std::uint8_t>(aux_mode << kAuxModeShift);

    if (detail == 0) {
      flags |= kPredicted;
    } else {
      columns.detail.push_back(detail);
    }
    columns.flags.push_back(flags);
    predictor.learn(event, kind, block, at_site);
  }
  return columns;
}

void decode(const EventColumns& columns, std::vector<Event>& events) {
  ColumnReaders read(columns);
  events.clear();
  events.reserve(columns.flags.size());
  Predictor predictor;
  for (std::uint64_t index = 0; index < columns.count; ++index) {
    const std::uint8_t flags = columns.flags[index];
    auto kind = static_cast<std::uint8_t>(flags & kKindMask);
    Event event;
    event.thread = predictor.thread;
    event.device = predictor.device;
    event.stream = predictor.stream;

    if (kind == kContextEscape) {
      const std::uint8_t context = read.context.byte(index);
      if ((context & (kThreadChanged | kDeviceChanged | kStreamChanged)) == 0 || (context & 0x80) != 0) {
        fail_at(index, "has an invalid context byte " + std::to_string(context));
      }
      kind = static_cast<std::uint8_t>(context & kKindMask);
      if (context & kThreadChanged) {
        const std::uint64_t thread = read.context.varint(index);
        if (thread > UINT32_MAX) fail_at(index, "has a thread index past 32 bits");
        event.thread = static_cast<std::uint32_t>(thread);
      }
      if (context & kDeviceChanged) {
        const std::int64_t device = unzigzag(read.context.varint(index));
        if (device < INT32_MIN || device > INT32_MAX) fail_at(index, "has a device index past 32 bits");
        event.device = static_cast<std::int32_t>(device);
      }
      if (context & kStreamChanged) event.stream = read.context.varint(index);
    }
    event.kind = static_cast<EventKind>(kind);  // validate() rejects kinds past the last one

    event.time_ns = (flags & kSameTime) ? predictor.time_ns : predictor.time_ns + read.time.varint(index);

    switch (static_cast<AddressMode>((flags >> kAddressModeShift) & 0x3)) {
      case address_same: event.address = predictor.last_address; break;
      case address_recent: {
        const std::uint64_t recent = read.address.varint(index);
        if (recent >= predictor.recent_addresses.size()) {
          fail_at(index, "names recent address " + std::to_string(recent) + " of " +
                             std::to_string(predictor.recent_addresses.size()));
        }
        event.address = predictor.recent_addresses[recent];
        predictor.address_listed_at = recent;
        break;
      }
      case address_aligned_delta:
        event.address =
            predictor.last_address + (static_cast<std::uint64_t>(unzigzag(read.address.varint(index))) << kAlignShift);
        break;
      case address_raw_delta:
        event.address = predictor.last_address + static_cast<std::uint64_t>(unzigzag(read.address.varint(index)));
        break;
    }

    const Remembered* block = predictor.live_block(event.address);
    const std::uint8_t detail = (flags & kPredicted) ? 0 : read.detail.byte(index);
    switch (static_cast<StackMode>(detail & 0x3)) {
      case stack_predicted: event.stack = predictor.predicted_stack(kind, block); break;
      case stack_none: event.stack = StackId{}; break;
      case stack_recent: {
        const std::uint64_t recent = read.stack.varint(index);
        if (recent >= predictor.recent_stacks.size()) {
          fail_at(index, "names recent stack " + std::to_string(recent) + " of " +
                             std::to_string(predictor.recent_stacks.size()));
        }
        event.stack = predictor.recent_stacks[recent];
        predictor.stack_listed_at = recent;
        break;
      }
      case stack_explicit: event.stack = read_stack_id(read.stack, index); break;
    }

    Remembered& at_site = predictor.site(event.stack, kind);
    const Remembered site = at_site;
    switch (static_cast<SizeMode>((detail >> kSizeModeShift) & 0x7)) {
      case size_predicted: event.size = predictor.predicted_size(kind, event.address, block, site); break;
      case size_zero: event.size = 0; break;
      case size_aligned: event.size = read.size.varint(index) << kAlignShift; break;
      case size_raw: event.size = read.size.varint(index); break;
      case size_previous: event.size = predictor.last_size; break;
      case size_grown: event.size = predictor.last_size + (read.size.varint(index) << kAlignShift); break;
      case size_free_block: event.size = predictor.free_block(event.address); break;
      case size_site: event.size = site.size; break;
    }
    switch (static_cast<AuxMode>(detail >> kAuxModeShift)) {
      case aux_predicted: event.aux = predictor.predicted_aux(kind, event.address, event.size, block, site); break;
      case aux_zero: event.aux = 0; break;
      case aux_below_size: event.aux = event.size - read.aux.varint(index); break;
      case aux_aligned: event.aux = read.aux.varint(index) << kAlignShift; break;
      case aux_raw: event.aux = read.aux.varint(index); break;
      case aux_growth: event.aux = event.size - predictor.last_size; break;
      case aux_previous_size: event.aux = predictor.last_size; break;
      case aux_site: event.aux = site.aux; break;
    }

    predictor.learn(event, kind, block, at_site);
    events.push_back(event);
  }
  read.expect_consumed();
}

}  // namespace v2

// ===========================================================================
// Encoding 3 (format version 6): written and read.
// ===========================================================================
// Cheap to decode: no predictor maps and no recent lists. Every field comes
// from the previous event, from one earlier event of the block named by its
// distance (the "reference"), or from the columns. The encoder does the
// searching (which earlier event repeats the most fields); the decoder only
// indexes the events it has already written.
namespace v3 {

// Flag byte: kind in bits 0-3, or kContextEscape (the kind then moves to the
// context byte, as in encoding 2); bit 4 = same time as the previous event;
// bit 5 = a reference distance is stored (else the reference is the
// previous event); bit 6 = the detail byte repeats the last one of this
// kind and is not stored; bit 7 must be 0.
constexpr std::uint8_t kKindMask = 0x0f;
constexpr std::uint8_t kContextEscape = 0x0f;
constexpr std::uint8_t kSameTime = 0x10;
constexpr std::uint8_t kHasReference = 0x20;
constexpr std::uint8_t kRepeatDetail = 0x40;
constexpr std::uint8_t kReservedFlag = 0x80;

constexpr std::uint8_t kThreadChanged = 0x10;
constexpr std::uint8_t kDeviceChanged = 0x20;
constexpr std::uint8_t kStreamChanged = 0x40;

// Detail byte: two bits per field. Mode 1 is always "the reference's".
enum AddressMode : std::uint8_t {
  address_previous = 0,       // the previous event's address
  address_reference = 1,      // the reference's address
  address_aligned_delta = 2,  // previous + 512 * unzigzag(varint)
  address_raw_delta = 3,      // previous + unzigzag(varint)
};
enum StackMode : std::uint8_t { stack_previous = 0, stack_reference = 1, stack_none = 2, stack_explicit = 3 };
enum SizeMode : std::uint8_t { size_previous = 0, size_reference = 1, size_aligned = 2, size_raw = 3 };
enum AuxMode : std::uint8_t { aux_zero = 0, aux_reference = 1, aux_below_size = 2, aux_raw = 3 };
constexpr unsigned kAddressShift = 0;
constexpr unsigned kStackShift = 2;
constexpr unsigned kSizeShift = 4;
constexpr unsigned kAuxShift = 6;

constexpr std::size_t kNoCost = 1000;

// The cost in column bytes of each of a field's four modes (kNoCost where
// the mode does not reproduce the value) and the value a storing mode writes.
struct FieldChoice {
  std::array<std::size_t, 4> cost{kNoCost, kNoCost, kNoCost, kNoCost};
  std::array<std::uint64_t, 4> value{};
  // The cheapest mode, `preferred` (the last detail byte's) on a tie.
  std::uint8_t best(std::uint8_t preferred) const {
    std::uint8_t pick = 0;
    for (std::uint8_t m = 1; m < 4; ++m) {
      if (cost[m] < cost[pick]) pick = m;
    }
    return cost[preferred] == cost[pick] ? preferred : pick;
  }
};

FieldChoice choose_address(std::uint64_t address, const Event& previous, const Event& reference) {
  FieldChoice c;
  if (address == previous.address) c.cost[address_previous] = 0;
  if (address == reference.address) c.cost[address_reference] = 0;
  const std::uint64_t delta = address - previous.address;
  if ((delta & kAlignMask) == 0) {
    c.value[address_aligned_delta] = zigzag(static_cast<std::int64_t>(delta) >> kAlignShift);
    c.cost[address_aligned_delta] = varint_length(c.value[address_aligned_delta]);
  }
  c.value[address_raw_delta] = zigzag(static_cast<std::int64_t>(delta));
  c.cost[address_raw_delta] = varint_length(c.value[address_raw_delta]);
  return c;
}
FieldChoice choose_stack(StackId stack, const Event& previous, const Event& reference) {
  FieldChoice c;
  if (stack == previous.stack) c.cost[stack_previous] = 0;
  if (stack == reference.stack) c.cost[stack_reference] = 0;
  if (!stack) c.cost[stack_none] = 0;
  c.value[stack_explicit] = stack.value;
  c.cost[stack_explicit] = varint_length(stack.value);
  return c;
}
FieldChoice choose_size(std::uint64_t size, const Event& previous, const Event& reference) {
  FieldChoice c;
  if (size == previous.size) c.cost[size_previous] = 0;
  if (size == reference.size) c.cost[size_reference] = 0;
  if ((size & kAlignMask) == 0) {
    c.value[size_aligned] = size >> kAlignShift;
    c.cost[size_aligned] = varint_length(c.value[size_aligned]);
  }
  c.value[size_raw] = size;
  c.cost[size_raw] = varint_length(size);
  return c;
}
FieldChoice choose_aux(std::uint64_t aux, std::uint64_t size, const Event& reference) {
  FieldChoice c;
  if (aux == 0) c.cost[aux_zero] = 0;
  if (aux == reference.aux) c.cost[aux_reference] = 0;
  if (aux <= size) {
    c.value[aux_below_size] = size - aux;
    c.cost[aux_below_size] = varint_length(size - aux);
  }
  c.value[aux_raw] = aux;
  c.cost[aux_raw] = varint_length(aux);
  return c;
}

// One way to code an event: its reference and the four modes.
struct Plan {
  std::size_t cost = kNoCost * 8;
  std::uint64_t distance = 1;  // 1 without a stored reference
  std::uint8_t detail = 0;
  FieldChoice address, stack, size, aux;
};

Plan plan(const Event& event, const Event& previous, const Event& reference, std::uint64_t distance,
          bool stored, std::uint8_t last_detail) {
  Plan p;
  p.distance = distance;
  p.address = choose_address(event.address, previous, reference);
  p.stack = choose_stack(event.stack, previous, reference);
  p.size = choose_size(event.size, previous, reference);
  p.aux = choose_aux(event.aux, event.size, reference);
  const std::uint8_t a = p.address.best((last_detail >> kAddressShift) & 3);
  const std::uint8_t st = p.stack.best((last_detail >> kStackShift) & 3);
  const std::uint8_t si = p.size.best((last_detail >> kSizeShift) & 3);
  const std::uint8_t au = p.aux.best((last_detail >> kAuxShift) & 3);
  p.detail = static_cast<std::uint8_t>(a << kAddressShift | st << kStackShift | si << kSizeShift | au << kAuxShift);
  p.cost = p.address.cost[a] + p.stack.cost[st] + p.size.cost[si] + p.aux.cost[au] +
           (p.detail == last_detail ? 0 : 1) + (stored ? varint_length(distance) : 0);
  return p;
}

EventColumns encode(std::span<const Event> events) {
  EventColumns columns;
  columns.encoding = 3;
  columns.count = events.size();
  columns.flags.reserve(events.size());
  // Encoder only: where each candidate reference was last seen.
  FlatMap<std::uint64_t> last_at_address;  // address -> index + 1
  FlatMap<std::uint64_t> last_at_site;     // (stack, kind) -> index + 1
  std::array<std::uint64_t, 16> last_of_kind{};  // index + 1, 0 for none
  std::array<std::uint8_t, 16> last_detail{};
  const Event none{};
  std::uint32_t thread = 0;
  std::int32_t device = 0;
  std::uint64_t stream = 0;
  for (std::size_t index = 0; index < events.size(); ++index) {
    const Event& event = events[index];
    const Event& previous = index == 0 ? none : events[index - 1];
    const auto kind = static_cast<std::uint8_t>(static_cast<std::uint8_t>(event.kind) & kKindMask);
    std::uint8_t flags = kind;

    std::uint8_t context = 0;
    if (event.thread != thread) context |= kThreadChanged;
    if (event.device != device) context |= kDeviceChanged;
    if (event.stream != stream) context |= kStreamChanged;
    if (context != 0) {
      flags = kContextEscape;
      columns.context.push_back(context | kind);
      if (context & kThreadChanged) put_varint(columns.context, event.thread);
      if (context & kDeviceChanged) put_varint(columns.context, zigzag(event.device));
      if (context & kStreamChanged) put_varint(columns.context, event.stream);
    }
    thread = event.thread;
    device = event.device;
    stream = event.stream;

    if (event.time_ns == previous.time_ns) {
      flags |= kSameTime;
    } else {
      put_varint(columns.time, event.time_ns - previous.time_ns);
    }

    // The previous event as the reference (nothing stored), then the last
    // event at this address, of this (stack, kind), and of this kind.
    Plan best = plan(event, previous, previous, 1, false, last_detail[kind]);
    std::array<std::uint64_t, 3> candidates{};
    if (const std::uint64_t* at = last_at_address.find(event.address)) candidates[0] = *at;
    if (const std::uint64_t* at = last_at_site.find((std::uint64_t{event.stack.value} << 4) | kind)) candidates[1] = *at;
    candidates[2] = last_of_kind[kind];
    for (const std::uint64_t candidate : candidates) {
      if (candidate == 0 || candidate == index) continue;  // none, or the previous event
      const std::uint64_t distance = index + 1 - candidate;
      Plan p = plan(event, previous, events[candidate - 1], distance, true, last_detail[kind]);
      if (p.cost < best.cost) best = p;
    }
    if (best.distance != 1) {
      flags |= kHasReference;
      put_varint(columns.address, best.distance);
    }
    const std::uint8_t detail = best.detail;
    const auto a = static_cast<std::uint8_t>((detail >> kAddressShift) & 3);
    const auto st = static_cast<std::uint8_t>((detail >> kStackShift) & 3);
    const auto si = static_cast<std::uint8_t>((detail >> kSizeShift) & 3);
    const auto au = static_cast<std::uint8_t>((detail >> kAuxShift) & 3);
    if (a >= address_aligned_delta) put_varint(columns.address, best.address.value[a]);
    if (st == stack_explicit) put_varint(columns.stack, best.stack.value[st]);
    if (si >= size_aligned) put_varint(columns.size, best.size.value[si]);
    if (au >= aux_below_size) put_varint(columns.aux, best.aux.value[au]);
    if (detail == last_detail[kind]) {
      flags |= kRepeatDetail;
    } else {
      columns.detail.push_back(detail);
      last_detail[kind] = detail;
    }
    columns.flags.push_back(flags);

    last_at_address.insert(event.address, index + 1);
    last_at_site.insert((std::uint64_t{event.stack.value} << 4) | kind, index + 1);
    last_of_kind[kind] = index + 1;
  }
  return columns;
}

template <bool kPext>
void decode(const EventColumns& columns, std::vector<Event>& events, EventScreen* screen) {
  ColumnReaders read(columns);
  // Sized once and written in place: a streaming reader hands the same
  // vector back block after block, so this is no work after the first one,
  // where push_back paid a capacity check and a size update per event.
  // count == flags.size() (decode_events_into) bounds it by the input.
  reserve_with_huge_pages(events, columns.count);
  events.resize(columns.count);
  Event* const out = events.data();
  std::array<std::uint8_t, 16> last_detail{};
  const std::uint8_t* const flag_bytes = columns.flags.data();
  // The screen, branch-free, where each value comes from: a thread only
  // from the context column and a stack id only from the stack column (a
  // previous or reference event's was screened when it was decoded, and the
  // first event's previous is all zeros), so only the kind and an
  // annotation's string are screened per event, by one compare of aux
  // against a bound per kind: 6 instructions, where testing every field of
  // every event was 16 (session 10). "x != 0 && x >= limit" is
  // "x >= max(limit, 1)".
  const std::uint64_t thread_limit = screen != nullptr ? screen->thread_limit : UINT64_MAX;
  const std::uint64_t stack_floor = screen != nullptr ? std::max<std::uint64_t>(screen->stack_limit, 1) : UINT64_MAX;
  const std::uint64_t string_floor =
      screen != nullptr ? std::max<std::uint64_t>(screen->string_limit, 1) : std::uint64_t{1} << 32;
  // Flagged when (aux & mask) >= bound: a kind past the last (14 and 15)
  // whatever its aux (bound 0), an annotation for a string past the table,
  // any other kind never (mask 0, bound 1).
  static_assert(kEventKindCount <= 16, "a kind is 4 bits in the flag and context bytes");
  struct AuxScreen {
    std::uint64_t mask = 0;
    std::uint64_t bound = 1;
  };
  std::array<AuxScreen, 16> aux_screen{};
  for (unsigned k = kEventKindCount; k < aux_screen.size(); ++k) aux_screen[k].bound = 0;
  aux_screen[static_cast<unsigned>(EventKind::annotation_begin)] = {UINT64_MAX, string_floor};
  aux_screen[static_cast<unsigned>(EventKind::annotation_end)] = {UINT64_MAX, string_floor};
  bool flagged = false;
  // The previous event, kept by value: thread, device, stream and time carry
  // over from it. A reference to it is one to out[index - 1] (or, for the
  // first event, to kNoPrevious, equal to it): taking previous's address
  // kept it in memory, 7 stores and 7 loads per event more (session 10).
  Event previous{};
  static constexpr Event kNoPrevious{};
  for (std::uint64_t index = 0; index < columns.count; ++index) {
    const std::uint8_t flags = flag_bytes[index];
    if (flags & kReservedFlag) [[unlikely]]
      fail_at(index, "has an invalid flag byte " + std::to_string(flags));
    auto kind = static_cast<std::uint8_t>(flags & kKindMask);
    Event event = previous;
    if (kind == kContextEscape) [[unlikely]] {
      const std::uint8_t context = read.context.byte(index);
      if ((context & (kThreadChanged | kDeviceChanged | kStreamChanged)) == 0 || (context & 0x80) != 0) {
        fail_at(index, "has an invalid context byte " + std::to_string(context));
      }
      kind = static_cast<std::uint8_t>(context & kKindMask);
      if (context & kThreadChanged) {
        const std::uint64_t thread = read.context.template varint<kPext>(index);
        if (thread > UINT32_MAX) fail_at(index, "has a thread index past 32 bits");
        event.thread = static_cast<std::uint32_t>(thread);
        flagged |= thread >= thread_limit;
      }
      if (context & kDeviceChanged) {
        const std::int64_t device = unzigzag(read.context.template varint<kPext>(index));
        if (device < INT32_MIN || device > INT32_MAX) fail_at(index, "has a device index past 32 bits");
        event.device = static_cast<std::int32_t>(device);
      }
      if (context & kStreamChanged) event.stream = read.context.template varint<kPext>(index);
    }
    event.kind = static_cast<EventKind>(kind);  // validate() rejects kinds past the last one
    if (!(flags & kSameTime)) event.time_ns += read.time.template varint<kPext>(index);

    const Event* reference = index == 0 ? &kNoPrevious : out + (index - 1);
    if (flags & kHasReference) {
      const std::uint64_t distance = read.address.template varint<kPext>(index);
      if (distance == 0 || distance > index) [[unlikely]]
        fail_at(index, "refers to the event " + std::to_string(distance) + " before it, outside its block");
      reference = out + (index - distance);
    }
    std::uint8_t detail = last_detail[kind];
    if (!(flags & kRepeatDetail)) {
      detail = read.detail.byte(index);
      last_detail[kind] = detail;
    }

    // One branch per field, on whether the columns store it; the modes that
    // store nothing are selects. A switch per field was a tree of two or
    // three branches (session 10). The reference's fields are loaded
    // whatever the mode, so the selects need no branch to guard the load.
    const Event& ref = *reference;
    const unsigned address_mode = (detail >> kAddressShift) & 3;
    if (address_mode >= address_aligned_delta) {
      const auto delta = static_cast<std::uint64_t>(unzigzag(read.address.template varint<kPext>(index)));
      event.address += address_mode == address_aligned_delta ? delta << kAlignShift : delta;
    } else {
      event.address = address_mode == address_reference ? ref.address : event.address;
    }
    const unsigned stack_mode = (detail >> kStackShift) & 3;
    if (stack_mode == stack_explicit) {
      event.stack = read_stack_id<kPext>(read.stack, index);
      flagged |= event.stack.value >= stack_floor;
    } else {
      const std::uint32_t kept = stack_mode == stack_reference ? ref.stack.value : event.stack.value;
      event.stack.value = stack_mode == stack_none ? 0 : kept;
    }
    const unsigned size_mode = (detail >> kSizeShift) & 3;
    if (size_mode >= size_aligned) {
      const std::uint64_t size = read.size.template varint<kPext>(index);
      event.size = size_mode == size_aligned ? size << kAlignShift : size;
    } else {
      event.size = size_mode == size_reference ? ref.size : event.size;
    }
    const unsigned aux_mode = (detail >> kAuxShift) & 3;
    if (aux_mode >= aux_below_size) {
      const std::uint64_t aux = read.aux.template varint<kPext>(index);
      event.aux = aux_mode == aux_below_size ? event.size - aux : aux;
    } else {
      event.aux = aux_mode == aux_reference ? ref.aux : 0;
    }
    flagged |= (event.aux & aux_screen[kind].mask) >= aux_screen[kind].bound;
    out[index] = event;
    previous = event;
  }
  read.expect_consumed();
  if (screen != nullptr) screen->flagged = flagged;
}

void decode(const EventColumns& columns, std::vector<Event>& events, EventScreen* screen) {
  if (g_varint_pext.load(std::memory_order_relaxed))
    decode<true>(columns, events, screen);
  else
    decode<false>(columns, events, screen);
}

}  // namespace v3
}  // namespace

EventColumns encode_events(std::span<const Event> events) { return v3::encode(events); }

EventColumns encode_events(std::span<const Event> events, std::uint32_t encoding) {
  switch (encoding) {
    case 2: return v2::encode(events);
    case 3: return v3::encode(events);
    default: fail("event encoding " + std::to_string(encoding) + " cannot be written");
  }
}

void decode_events_into(const EventColumns& columns, std::vector<Event>& out, EventScreen* screen) {
  if (screen != nullptr) screen->flagged = true;  // until a decoder that screens says otherwise
  // One flag byte per event: checking this first bounds every allocation
  // below by the size of the input.
  if (columns.count != columns.flags.size()) {
    fail(std::to_string(columns.count) + " events declared but the flags column holds " +
         std::to_string(columns.flags.size()));
  }
  switch (columns.encoding) {
    case 1: v1::decode(columns, out); return;
    case 2: v2::decode(columns, out); return;
    case 3: v3::decode(columns, out, screen); return;
    default: fail("event encoding " + std::to_string(columns.encoding) + " does not exist");
  }
}

bool varint_pext() noexcept { return g_varint_pext.load(std::memory_order_relaxed); }

bool set_varint_pext(bool on) noexcept {
  const bool now = on && pext_is_fast();
  g_varint_pext.store(now, std::memory_order_relaxed);
  return now;
}

std::vector<Event> decode_events(const EventColumns& columns) {
  std::vector<Event> events;
  decode_events_into(columns, events);
  return events;
}

}  // namespace cachealloc::snapshot::detail
