#include "event_codec.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <unordered_map>

#include "cachealloc/snapshot/format.hpp"

// The encoder and the decoder run the same Predictor over the events they
// have seen so far, so both sides agree on every prediction without storing
// it. Bit layouts are in docs/FORMAT.md; keep the two in step.

namespace cachealloc::snapshot::detail {
namespace {

// Flag byte.
constexpr std::uint8_t kKindMask = 0x0f;
constexpr std::uint8_t kContextChanged = 0x10;
constexpr unsigned kAddressModeShift = 5;
constexpr std::uint8_t kFromLiveBlock = 0x80;

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

// Context byte (in the context column).
constexpr std::uint8_t kThreadChanged = 0x01;
constexpr std::uint8_t kDeviceChanged = 0x02;
constexpr std::uint8_t kStreamChanged = 0x04;

// Detail byte: stack mode in bits 0-1, size mode in bits 2-4, aux mode in bits 5-7.
enum StackMode : std::uint8_t { stack_none = 0, stack_previous = 1, stack_explicit = 2 };
enum SizeMode : std::uint8_t {
  size_predicted = 0,
  size_zero = 1,
  size_aligned = 2,
  size_raw = 3,
  size_previous = 4,  // the previous event's size
  size_grown = 5,     // the previous event's size + 512 * n: a merge grows the block just freed
};
constexpr std::uint8_t kSizeModeCount = 6;
enum AuxMode : std::uint8_t {
  aux_predicted = 0,
  aux_zero = 1,
  aux_below_size = 2,  // size - aux, for requested bytes just under the block size
  aux_aligned = 3,
  aux_raw = 4,
  aux_growth = 5,         // size - previous event's size: the bytes a merge absorbed
  aux_previous_size = 6,  // the previous event's size: a merge into the block before
};
constexpr std::uint8_t kAuxModeCount = 7;
constexpr unsigned kSizeModeShift = 2;
constexpr unsigned kAuxModeShift = 5;

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

[[noreturn]] void fail(const std::string& what) {
  throw SnapshotError(ErrorCode::inconsistent, "inconsistent snapshot: " + what);
}

class ColumnReader {
 public:
  ColumnReader(const std::vector<std::uint8_t>& bytes, const char* name) : bytes_(bytes), name_(name) {}

  std::uint8_t byte(std::uint64_t event) {
    if (position_ == bytes_.size()) ends_early(event);
    return bytes_[position_++];
  }
  std::uint64_t varint(std::uint64_t event) {
    std::uint64_t value = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
      const std::uint8_t next = byte(event);
      if (shift == 63 && next > 1) break;
      value |= static_cast<std::uint64_t>(next & 0x7f) << shift;
      if ((next & 0x80) == 0) return value;
    }
    fail("event " + std::to_string(event) + " has a varint longer than 64 bits in the " + name_ + " column");
  }
  void expect_consumed() const {
    if (position_ != bytes_.size()) {
      fail("the " + std::string(name_) + " column has " + std::to_string(bytes_.size() - position_) +
           " bytes after the last event");
    }
  }

 private:
  [[noreturn]] void ends_early(std::uint64_t event) const {
    fail("the " + std::string(name_) + " column ends before event " + std::to_string(event));
  }

  const std::vector<std::uint8_t>& bytes_;
  const char* name_;
  std::size_t position_ = 0;
};

struct Remembered {
  std::uint64_t size = 0;
  std::uint64_t aux = 0;
  StackId stack{};
};

// What both sides know before each event.
struct Predictor {
  std::uint32_t thread = 0;
  std::int32_t device = 0;
  std::uint64_t stream = 0;
  std::uint64_t time_ns = 0;
  std::uint64_t last_address = 0;
  std::uint64_t last_size = 0;
  StackId last_stack{};
  std::array<std::uint64_t, kRecentAddresses> recent{};  // most recent first
  std::size_t recent_count = 0;
  // Live blocks by address, filled by alloc and emptied by free_completed: the
  // free_* events of a block repeat its alloc's size, aux and stack, so they
  // cost one flag bit instead of three fields.
  std::unordered_map<std::uint64_t, Remembered> live;
  // (stack, kind) -> the size and aux it had last time: one call site tends
  // to ask for the same tensor shape every iteration.
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
  // Index of `address` in `recent`, or kRecentAddresses.
  std::size_t find_recent(std::uint64_t address) const {
    for (std::size_t i = 0; i < recent_count; ++i) {
      if (recent[i] == address) return i;
    }
    return kRecentAddresses;
  }
  void touch_recent(std::uint64_t address) {
    std::size_t at = find_recent(address);
    if (at == kRecentAddresses) {
      at = recent_count < kRecentAddresses ? recent_count++ : kRecentAddresses - 1;
    }
    std::copy_backward(recent.begin(), recent.begin() + static_cast<std::ptrdiff_t>(at),
                       recent.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    recent[0] = address;
  }
  void learn(const Event& event, std::uint8_t kind, bool used_detail) {
    thread = event.thread;
    device = event.device;
    stream = event.stream;
    time_ns = event.time_ns;
    if (event.address != 0) {
      last_address = event.address;
      touch_recent(event.address);
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

}  // namespace

EventColumns encode_events(std::span<const Event> events) {
  EventColumns columns;
  columns.count = events.size();
  columns.flags.reserve(events.size());
  columns.time.reserve(events.size() * 2);
  Predictor predictor;
  for (const Event& event : events) {
    const auto kind = static_cast<std::uint8_t>(static_cast<std::uint8_t>(event.kind) & kKindMask);
    std::uint8_t flags = kind;

    std::uint8_t context = 0;
    if (event.thread != predictor.thread) context |= kThreadChanged;
    if (event.device != predictor.device) context |= kDeviceChanged;
    if (event.stream != predictor.stream) context |= kStreamChanged;
    if (context != 0) {
      flags |= kContextChanged;
      columns.context.push_back(context);
      if (context & kThreadChanged) put_varint(columns.context, event.thread);
      if (context & kDeviceChanged) put_varint(columns.context, zigzag(event.device));
      if (context & kStreamChanged) put_varint(columns.context, event.stream);
    }

    // Wrapping difference: time never decreases in a recorded ring, but any
    // valid Snapshot must survive, and a wrapped delta decodes exactly.
    put_varint(columns.time, event.time_ns - predictor.time_ns);

    AddressMode address_mode = address_same;
    if (event.address != predictor.last_address) {
      const std::uint64_t delta = event.address - predictor.last_address;
      std::uint64_t value = zigzag(static_cast<std::int64_t>(delta));
      address_mode = address_raw_delta;
      if ((delta & kAlignMask) == 0) {
        address_mode = address_aligned_delta;
        value = zigzag(static_cast<std::int64_t>(delta) >> kAlignShift);
      }
      if (const std::size_t recent = predictor.find_recent(event.address);
          recent != kRecentAddresses && varint_length(recent) < varint_length(value)) {
        address_mode = address_recent;
        value = recent;
      }
      put_varint(columns.address, value);
    }
    flags |= static_cast<std::uint8_t>(address_mode << kAddressModeShift);

    const Remembered* block = predictor.live_block(event.address);
    const bool from_live_block =
        block != nullptr && block->size == event.size && block->aux == event.aux && block->stack == event.stack;
    if (from_live_block) {
      flags |= kFromLiveBlock;
    } else {
      std::uint8_t detail = 0;
      if (!event.stack) {
        detail |= stack_none;
      } else if (event.stack == predictor.last_stack) {
        detail |= stack_previous;
      } else {
        detail |= stack_explicit;
        put_varint(columns.stack, event.stack.value);
      }

      const Remembered site = predictor.site(event.stack, kind);
      SizeMode size_mode = size_raw;
      if (event.size == site.size) {
        size_mode = size_predicted;
      } else if (event.size == 0) {
        size_mode = size_zero;
      } else if (event.size == predictor.last_size) {
        size_mode = size_previous;
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
      if (event.aux == site.aux) {
        aux_mode = aux_predicted;
      } else if (event.aux == 0) {
        aux_mode = aux_zero;
      } else if (event.aux == event.size - predictor.last_size) {
        aux_mode = aux_growth;
      } else if (event.aux == predictor.last_size) {
        aux_mode = aux_previous_size;
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
      columns.detail.push_back(detail);
    }

    columns.flags.push_back(flags);
    predictor.learn(event, kind, !from_live_block);
  }
  return columns;
}

std::vector<Event> decode_events(const EventColumns& columns) {
  // One flag byte per event: checking this first bounds every allocation
  // below by the size of the input.
  if (columns.count != columns.flags.size()) {
    fail(std::to_string(columns.count) + " events declared but the flags column holds " +
         std::to_string(columns.flags.size()));
  }
  ColumnReader context_column(columns.context, "context");
  ColumnReader time_column(columns.time, "time");
  ColumnReader address_column(columns.address, "address");
  ColumnReader detail_column(columns.detail, "detail");
  ColumnReader stack_column(columns.stack, "stack");
  ColumnReader size_column(columns.size, "size");
  ColumnReader aux_column(columns.aux, "aux");

  std::vector<Event> events;
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
      const std::uint8_t context = context_column.byte(index);
      if (context == 0 || (context & ~(kThreadChanged | kDeviceChanged | kStreamChanged)) != 0) {
        fail("event " + std::to_string(index) + " has an invalid context byte " + std::to_string(context));
      }
      if (context & kThreadChanged) {
        const std::uint64_t thread = context_column.varint(index);
        if (thread > UINT32_MAX) fail("event " + std::to_string(index) + " has a thread index past 32 bits");
        event.thread = static_cast<std::uint32_t>(thread);
      }
      if (context & kDeviceChanged) {
        const std::int64_t device = unzigzag(context_column.varint(index));
        if (device < INT32_MIN || device > INT32_MAX) {
          fail("event " + std::to_string(index) + " has a device index past 32 bits");
        }
        event.device = static_cast<std::int32_t>(device);
      }
      if (context & kStreamChanged) event.stream = context_column.varint(index);
    }

    event.time_ns = predictor.time_ns + time_column.varint(index);

    switch (static_cast<AddressMode>((flags >> kAddressModeShift) & 0x3)) {
      case address_same: event.address = predictor.last_address; break;
      case address_recent: {
        const std::uint64_t recent = address_column.varint(index);
        if (recent >= predictor.recent_count) {
          fail("event " + std::to_string(index) + " names recent address " + std::to_string(recent) + " of " +
               std::to_string(predictor.recent_count));
        }
        event.address = predictor.recent[recent];
        break;
      }
      case address_aligned_delta:
        event.address =
            predictor.last_address + (static_cast<std::uint64_t>(unzigzag(address_column.varint(index))) << kAlignShift);
        break;
      case address_raw_delta:
        event.address = predictor.last_address + static_cast<std::uint64_t>(unzigzag(address_column.varint(index)));
        break;
    }

    const bool from_live_block = (flags & kFromLiveBlock) != 0;
    if (from_live_block) {
      const Remembered* block = predictor.live_block(event.address);
      if (block == nullptr) {
        fail("event " + std::to_string(index) + " repeats a live block but none is at its address");
      }
      event.size = block->size;
      event.aux = block->aux;
      event.stack = block->stack;
    } else {
      const std::uint8_t detail = detail_column.byte(index);
      switch (detail & 0x3) {
        case stack_none: event.stack = StackId{}; break;
        case stack_previous: event.stack = predictor.last_stack; break;
        case stack_explicit: {
          const std::uint64_t stack = stack_column.varint(index);
          if (stack > UINT32_MAX) fail("event " + std::to_string(index) + " has a stack id past 32 bits");
          event.stack = StackId{static_cast<std::uint32_t>(stack)};
          break;
        }
        default: fail("event " + std::to_string(index) + " has an invalid stack mode");
      }
      const Remembered site = predictor.site(event.stack, kind);
      const auto size_mode = static_cast<std::uint8_t>((detail >> kSizeModeShift) & 0x7);
      const auto aux_mode = static_cast<std::uint8_t>(detail >> kAuxModeShift);
      if (size_mode >= kSizeModeCount || aux_mode >= kAuxModeCount) {
        fail("event " + std::to_string(index) + " has an invalid detail byte " + std::to_string(detail));
      }
      switch (size_mode) {
        case size_predicted: event.size = site.size; break;
        case size_zero: event.size = 0; break;
        case size_aligned: event.size = size_column.varint(index) << kAlignShift; break;
        case size_raw: event.size = size_column.varint(index); break;
        case size_previous: event.size = predictor.last_size; break;
        case size_grown: event.size = predictor.last_size + (size_column.varint(index) << kAlignShift); break;
      }
      switch (aux_mode) {
        case aux_predicted: event.aux = site.aux; break;
        case aux_zero: event.aux = 0; break;
        case aux_below_size: event.aux = event.size - aux_column.varint(index); break;
        case aux_aligned: event.aux = aux_column.varint(index) << kAlignShift; break;
        case aux_raw: event.aux = aux_column.varint(index); break;
        case aux_growth: event.aux = event.size - predictor.last_size; break;
        case aux_previous_size: event.aux = predictor.last_size; break;
      }
    }
    predictor.learn(event, kind, !from_live_block);
    events.push_back(event);
  }
  context_column.expect_consumed();
  time_column.expect_consumed();
  address_column.expect_consumed();
  detail_column.expect_consumed();
  stack_column.expect_consumed();
  size_column.expect_consumed();
  aux_column.expect_consumed();
  return events;
}

}  // namespace cachealloc::snapshot::detail
