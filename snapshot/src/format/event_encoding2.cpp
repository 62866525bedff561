// Encoding 2 of the event columns (format versions 2 to 5): a frozen decoder,
// and its encoder, which writes it only on request (tests and benchmarks).
// Older files must read as they always did: never change the decoder.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cachealloc/snapshot/detail/flat_map.hpp"
#include "event_encodings.hpp"

namespace cachealloc::snapshot::detail::codec::encoding2 {
namespace {

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

}  // namespace

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
      read_context_fields(read.context, index, context, {kThreadChanged, kDeviceChanged, kStreamChanged}, event);
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

}  // namespace cachealloc::snapshot::detail::codec::encoding2
