// Encoding 1 of the event columns (format version 1): a frozen decoder, read
// only. Older files must read as they always did: never change it.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "event_encodings.hpp"

namespace cachealloc::snapshot::detail::codec::encoding1 {
namespace {


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

}  // namespace

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
      read_context_fields(read.context, index, context, {kThreadChanged, kDeviceChanged, kStreamChanged}, event);
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

}  // namespace cachealloc::snapshot::detail::codec::encoding1
