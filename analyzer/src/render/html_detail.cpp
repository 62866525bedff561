#include "render/html_detail.hpp"

#include <algorithm>

namespace cachealloc::analyzer::html {

std::vector<DetailWindow> plan_detail_windows(std::size_t events, std::size_t budget,
                                              const std::vector<DetailAnchor>& anchors) {
  if (events == 0) return {};
  if (events <= budget) return {DetailWindow{0, events, {"the whole trace"}}};
  if (anchors.empty()) return {DetailWindow{0, std::max<std::size_t>(budget, 1), {"the trace's first events"}}};
  // Each anchor gets an equal share, centred on it: the state after the
  // anchor's event and the events that led there are both in the page.
  const std::size_t share = std::max<std::size_t>(1, budget / anchors.size());
  std::vector<DetailWindow> windows;
  for (const DetailAnchor& anchor : anchors) {
    const std::size_t at = std::min(anchor.event, events - 1);
    std::size_t begin = at >= share / 2 ? at - share / 2 : 0;
    begin = std::min(begin, events - share);
    windows.push_back(DetailWindow{begin, begin + share, {anchor.reason}});
  }
  std::sort(windows.begin(), windows.end(), [](const DetailWindow& a, const DetailWindow& b) { return a.begin < b.begin; });
  std::vector<DetailWindow> merged;
  for (DetailWindow& w : windows) {
    if (!merged.empty() && w.begin <= merged.back().end) {
      DetailWindow& last = merged.back();
      last.end = std::max(last.end, w.end);
      for (std::string& reason : w.reasons)
        if (std::find(last.reasons.begin(), last.reasons.end(), reason) == last.reasons.end()) last.reasons.push_back(std::move(reason));
    } else {
      merged.push_back(std::move(w));
    }
  }
  return merged;
}

}  // namespace cachealloc::analyzer::html
