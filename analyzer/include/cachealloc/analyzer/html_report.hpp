// cachealloc-analyze html: one self-contained, offline HTML page with the
// memory timeline, the segment map at any event, the sites live then (with an
// icicle of their stacks), fragmentation over time and the summary.
//
// Levels of detail, so that a trace of millions of events stays fluid and the
// page holds only what it draws:
//   - timeline: the min and max of allocated, reserved and active per bucket
//     of max(kHtmlBucketEvents, ceil(events / HtmlOptions::max_buckets)) events (the
//     page merges them into coarser levels),
//     and allocated by category (categorize()) where it peaked in each bucket;
//     each alloc's category rides in its kind byte, each keyframe block's
//     beside its stack, so the page's replay knows every block's category;
//     a window of fewer than HtmlOptions::exact_events events is drawn event by
//     event, replayed in the page from the nearest keyframe;
//   - segment map: layout keyframes (Replay::layout(), every
//     max(kHtmlMinKeyframeGap, 4 x blocks) events) plus every event after them,
//     so the state after any event is exact and no block is ever dropped;
//   - detail: the per-event columns and keyframes cover the whole trace when
//     it holds at most HtmlOptions::detail_events events; a longer trace keeps
//     them only for detail windows (html_detail.hpp) around the allocated and
//     reserved peaks, the first OOMs and the last events, which the page names;
//     elsewhere it draws buckets and says the event-level state is not in it;
//   - fragmentation: CacheFigures sampled at kHtmlFragmentationSamples points;
//   - summary and OOM panels: summary_report and oom_report, as their JSON.
// Binary columns are varint-coded, gzip-compressed and base64-encoded into
// the page, and decoded there with DecompressionStream (no network).
//
// Cost: summary_report, oom_report, categorize(), one backward pass (derive_initial_layout,
// unless the file stores its ring start) and one forward replay; past the
// detail budget, one more analyze() for the peaks' and OOMs' events.
// Memory: the replayed state plus the encoded page: about 4-6 bytes per
// event kept in detail and ~20 per bucket, so at most ~20 MB by default.
// Throws SnapshotError as the other reports do. Thread safety: reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <vector>

#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/reports.hpp"

namespace cachealloc::analyzer {

inline constexpr std::size_t kHtmlBucketEvents = 64;
inline constexpr std::size_t kHtmlMinKeyframeGap = 4096;
inline constexpr std::size_t kHtmlFragmentationSamples = 2000;

struct HtmlOptions {
  // Windows holding fewer events than this are drawn event by event.
  std::size_t exact_events = 10000;
  // Events the page keeps event by event (segment map, sites, exact zoom);
  // a longer trace keeps them only in detail windows of this many in all.
  std::size_t detail_events = 2'000'000;
  // The timeline's buckets grow past kHtmlBucketEvents events to stay this few.
  std::size_t max_buckets = 250'000;
};

// What write_html_report put in the page, for tests and --verbose output.
struct HtmlReportStats {
  std::size_t events = 0;
  std::size_t keyframes = 0;
  std::size_t keyframe_blocks = 0;  // blocks over all keyframes
  std::size_t buckets = 0;
  std::size_t bucket_events = 0;  // events per bucket
  std::size_t detail_events = 0;  // events kept event by event
  std::vector<EventWindow> detail_windows;  // where, in event order
  std::size_t bytes = 0;  // the page's size
};

HtmlReportStats write_html_report(EventSource& source, const ReportOptions& options, const HtmlOptions& html,
                                  std::ostream& out);

}  // namespace cachealloc::analyzer
