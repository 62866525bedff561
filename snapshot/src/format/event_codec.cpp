// The event codec's entry points: each encoding by its number, and the
// checks every decoder relies on first.
#include "event_codec.hpp"

#include <string>

#include "event_encodings.hpp"

namespace cachealloc::snapshot::detail {

EventColumns encode_events(std::span<const Event> events) { return codec::encoding3::encode(events); }

EventColumns encode_events(std::span<const Event> events, std::uint32_t encoding) {
  switch (encoding) {
    case 2: return codec::encoding2::encode(events);
    case 3: return codec::encoding3::encode(events);
    default: codec::fail("event encoding " + std::to_string(encoding) + " cannot be written");
  }
}

void decode_events_into(const EventColumns& columns, std::vector<Event>& out, EventScreen* screen) {
  if (screen != nullptr) screen->flagged = true;  // until a decoder that screens says otherwise
  // One flag byte per event: checking this first bounds every allocation
  // below by the size of the input.
  if (columns.count != columns.flags.size()) {
    codec::fail(std::to_string(columns.count) + " events declared but the flags column holds " +
                std::to_string(columns.flags.size()));
  }
  switch (columns.encoding) {
    case 1: codec::encoding1::decode(columns, out); return;
    case 2: codec::encoding2::decode(columns, out); return;
    case 3: codec::encoding3::decode(columns, out, screen); return;
    default: codec::fail("event encoding " + std::to_string(columns.encoding) + " does not exist");
  }
}

std::vector<Event> decode_events(const EventColumns& columns) {
  std::vector<Event> events;
  decode_events_into(columns, events);
  return events;
}

}  // namespace cachealloc::snapshot::detail
