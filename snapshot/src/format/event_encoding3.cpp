// Encoding 3 of the event columns (format version 6): the one we write.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cachealloc/snapshot/detail/flat_map.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/invariants.hpp"
#include "event_encodings.hpp"
#include "huge_pages.hpp"

// Cheap to decode: no predictor maps and no recent lists. Every field comes
// from the previous event, from one earlier event of the block named by its
// distance (the "reference"), or from the columns. The encoder does the
// searching (which earlier event repeats the most fields); the decoder only
// indexes the events it has already written.
namespace cachealloc::snapshot::detail::codec::encoding3 {
namespace {

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

}  // namespace

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

namespace {

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
  // every event was 16. "x != 0 && x >= limit" is
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
  // Sizes and times past their bounds (invariants.hpp); aux counts bytes for
  // the kinds up to merge. A time below the previous one is a delta that
  // wrapped 64 bits (deltas are unsigned).
  const std::uint64_t size_limit = screen != nullptr ? screen->size_limit : UINT64_MAX;
  const std::uint64_t time_limit = screen != nullptr ? kMaxPlausibleTimeNs : UINT64_MAX;
  if (size_limit != UINT64_MAX) {
    for (unsigned k = 0; k <= static_cast<unsigned>(EventKind::merge); ++k) aux_screen[k] = {UINT64_MAX, size_limit + 1};
  }
  // Kinds with no aux (kind_has_aux): any figure there.
  if (screen != nullptr) {
    for (unsigned k = 0; k < static_cast<unsigned>(kEventKindCount); ++k) {
      if (!kind_has_aux(static_cast<EventKind>(k))) aux_screen[k] = {UINT64_MAX, 1};
    }
    aux_screen[static_cast<unsigned>(EventKind::segment_alloc)] = {~kSegmentFlagsMask, 1};
    aux_screen[static_cast<unsigned>(EventKind::category)] = {UINT64_MAX, events::kAllocationCategoryCount};
  }
  bool flagged = false;
  // The previous event, kept by value: thread, device, stream and time carry
  // over from it. A reference to it is one to out[index - 1] (or, for the
  // first event, to kNoPrevious, equal to it): taking previous's address
  // kept it in memory, 7 stores and 7 loads per event more.
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
      read_context_fields<kPext>(read.context, index, context, {kThreadChanged, kDeviceChanged, kStreamChanged}, event);
      flagged |= ((context & kThreadChanged) != 0 && event.thread >= thread_limit) | (event.device < 0);
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
    // three branches. The reference's fields are loaded
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
    flagged |= (event.size > size_limit) | (event.time_ns > time_limit) | (event.time_ns < previous.time_ns);
    // An alloc's or free's block is never smaller than its request.
    flagged |= screen != nullptr && (kind <= static_cast<std::uint8_t>(EventKind::free_completed)) & (event.aux > event.size);
    out[index] = event;
    previous = event;
  }
  read.expect_consumed();
  if (screen != nullptr) screen->flagged = flagged;
}

}  // namespace

void decode(const EventColumns& columns, std::vector<Event>& events, EventScreen* screen) {
  if (varint_pext())
    decode<true>(columns, events, screen);
  else
    decode<false>(columns, events, screen);
}

}  // namespace cachealloc::snapshot::detail::codec::encoding3
