// What the three encodings of the event columns share (docs/FORMAT.md,
// "Events"), and the entry point of each, for event_codec.cpp to dispatch
// to. Private to the snapshot library.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cachealloc/snapshot/model.hpp"
#include "event_codec.hpp"
#include "varint.hpp"

// The encoder and the decoder run the same predictor over the events they
// have seen so far, so both sides agree on every prediction without storing
// it. Bit layouts are in docs/FORMAT.md; keep the two in step.
//
// Encoding 3 is what we write. Encodings 1 and 2 are only read: their
// decoders are kept as they were when format versions 1 and 2-5 were
// current, and must not change, or those files would read differently.
// What they use from here and varint.hpp is theirs too: change it with that
// in mind.
namespace cachealloc::snapshot::detail::codec {

// Block sizes and addresses are multiples of 512 in the caching allocator;
// dividing first saves 9 bits, about one varint byte, per value.
inline constexpr unsigned kAlignShift = 9;
inline constexpr std::uint64_t kAlignMask = (std::uint64_t{1} << kAlignShift) - 1;

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

// The bits of a context byte that say which of an event's thread, device and
// stream changed; each encoding places them differently.
struct ContextBits {
  std::uint8_t thread, device, stream;
};

// Reads the fields `context` says changed, in the order every encoding
// writes them (thread, device, stream), into `event`.
template <bool kPext = false>
void read_context_fields(ColumnReader& column, std::uint64_t index, std::uint8_t context, ContextBits bits,
                         Event& event) {
  if (context & bits.thread) {
    const std::uint64_t thread = column.template varint<kPext>(index);
    if (thread > UINT32_MAX) fail_at(index, "has a thread index past 32 bits");
    event.thread = static_cast<std::uint32_t>(thread);
  }
  if (context & bits.device) {
    const std::int64_t device = unzigzag(column.template varint<kPext>(index));
    if (device < INT32_MIN || device > INT32_MAX) fail_at(index, "has a device index past 32 bits");
    event.device = static_cast<std::int32_t>(device);
  }
  if (context & bits.stream) event.stream = column.template varint<kPext>(index);
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

// Encoding 1 (format version 1): read only.
namespace encoding1 {
void decode(const EventColumns& columns, std::vector<Event>& events);
}  // namespace encoding1

// Encoding 2 (format versions 2 to 5): read, and written only on request
// (encode_events(events, 2): tests and benchmarks).
namespace encoding2 {
EventColumns encode(std::span<const Event> events);
void decode(const EventColumns& columns, std::vector<Event>& events);
}  // namespace encoding2

// Encoding 3 (format version 6): written and read. `screen`: as
// decode_events_into (event_codec.hpp).
namespace encoding3 {
EventColumns encode(std::span<const Event> events);
void decode(const EventColumns& columns, std::vector<Event>& events, EventScreen* screen);
}  // namespace encoding3

}  // namespace cachealloc::snapshot::detail::codec
