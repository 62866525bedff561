#include "cachealloc/snapshot/invariants.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "cachealloc/snapshot/text.hpp"

namespace cachealloc::snapshot {
namespace {

std::optional<std::string> segments_problem(const std::vector<Segment>& segments, const std::string& suffix) {
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const Segment& segment = segments[s];
    const std::string where = "segment " + std::to_string(s) + suffix;
    if (segment.total_size > UINT64_MAX - segment.address) return where + " wraps around the address space";
    std::uint64_t cursor = segment.address;
    const std::uint64_t end = segment.address + segment.total_size;
    for (std::size_t b = 0; b < segment.blocks.size(); ++b) {
      const Block& block = segment.blocks[b];
      const std::string which = "block " + std::to_string(b) + " of " + where;
      if (block.address < segment.address || block.address > end || block.size > end - block.address)
        return which + " lies outside its segment";
      if (block.address < cursor) return which + " overlaps the block before it";
      if (block.address > cursor) return which + " leaves a gap of " + std::to_string(block.address - cursor) +
                                         " bytes before it: the block sizes do not add up to the segment's";
      cursor = block.address + block.size;
    }
    if (cursor != end) {
      return where + "'s blocks cover " + std::to_string(cursor - segment.address) + " of its " +
             std::to_string(segment.total_size) + " bytes: the block sizes do not add up to the segment's";
    }
  }
  // Overlap between segments of one device: sorted by (device, address),
  // each must end at or before the next begins.
  std::vector<std::size_t> order(segments.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return segments[a].device != segments[b].device ? segments[a].device < segments[b].device
                                                    : segments[a].address < segments[b].address;
  });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const Segment& before = segments[order[k - 1]];
    const Segment& after = segments[order[k]];
    if (before.device == after.device && after.address < before.address + before.total_size) {
      return "segment " + std::to_string(order[k]) + suffix + " (device " + std::to_string(after.device) +
             ") overlaps segment " + std::to_string(order[k - 1]);
    }
  }
  return std::nullopt;
}

std::optional<std::string> text_problem(const std::string& text, const std::string& where) {
  if (invalid_utf8_bytes(text) == 0) return std::nullopt;
  return where + " is not valid UTF-8";
}

}  // namespace

std::optional<std::string> layout_problem(const Snapshot& snapshot) {
  if (auto problem = segments_problem(snapshot.segments, "")) return problem;
  for (std::size_t r = 0; r < snapshot.ring_start.size(); ++r) {
    if (auto problem = segments_problem(snapshot.ring_start[r].segments, " of ring start " + std::to_string(r)))
      return problem;
  }
  for (std::size_t i = 0; i < snapshot.strings.size(); ++i) {
    if (auto problem = text_problem(snapshot.strings[i], "string " + std::to_string(i))) return problem;
  }
  const Header& header = snapshot.header;
  for (const auto& [text, name] : {std::pair{&header.writer_version, "the writer version"},
                                  std::pair{&header.source, "the source"}, std::pair{&header.program, "the program"},
                                  std::pair{&header.host, "the host"}}) {
    if (auto problem = text_problem(*text, name)) return problem;
  }
  for (std::size_t i = 0; i < header.arguments.size(); ++i) {
    if (auto problem = text_problem(header.arguments[i], "argument " + std::to_string(i))) return problem;
  }
  for (const DeviceInfo& device : snapshot.devices) {
    const std::string where = "device " + std::to_string(device.index);
    if (auto problem = text_problem(device.name, where + "'s name")) return problem;
    if (auto problem = text_problem(device.usage_note, where + "'s usage note")) return problem;
  }
  for (const auto& [key, value] : snapshot.settings) {
    if (auto problem = text_problem(key, "a setting's name")) return problem;
    if (auto problem = text_problem(value, "setting " + printable(key.substr(0, 64)))) return problem;
  }
  return std::nullopt;
}

}  // namespace cachealloc::snapshot
