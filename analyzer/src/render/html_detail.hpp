// Which events the HTML page keeps event by event. Below the budget, the
// whole trace; above it, windows around the moments a reader opens first
// (the allocated and reserved peaks, the first OOMs, the trace's last
// events), which together hold at most the budget. Outside them the page
// holds only the timeline's buckets, so its size stays bounded whatever the
// trace's length.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace cachealloc::analyzer::html {

// Events [begin, end) of the trace, and why they are kept ("allocated peak").
struct DetailWindow {
  std::size_t begin = 0, end = 0;
  std::vector<std::string> reasons;
};

// An event a window is kept around, and why.
struct DetailAnchor {
  std::size_t event = 0;
  std::string reason;
};

// Windows in event order, disjoint and never adjacent (adjacent ones merge),
// holding at most max(budget, 1) events in all; every anchor's event lies
// inside one with events on both sides where the trace has them. An anchor
// at or past `events` stands for the trace's last events.
std::vector<DetailWindow> plan_detail_windows(std::size_t events, std::size_t budget,
                                              const std::vector<DetailAnchor>& anchors);

}  // namespace cachealloc::analyzer::html
