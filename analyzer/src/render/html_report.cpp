#include "cachealloc/analyzer/html_report.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/document.hpp"
#include "cachealloc/snapshot/ring_start.hpp"
#include "html_script_parts.hpp"
#include "cachealloc/analyzer/categories.hpp"
#include "render/html_categories.hpp"
#include "render/html_detail.hpp"
#include "render/html_payload.hpp"
#include "reports/report_helpers.hpp"

namespace cachealloc::analyzer {

namespace assets {
extern const std::string_view kUplotJs;
extern const std::string_view kUplotCss;
// The page script's parts, in the order they run (assets.cmake lists them).
extern const std::string_view CACHEALLOC_REPORT_SCRIPT_PARTS;
const std::string_view kReportScriptParts[] = {CACHEALLOC_REPORT_SCRIPT_PARTS};
extern const std::string_view kReportCss;
}  // namespace assets

using snapshot::BlockState;
using snapshot::Event;
using snapshot::EventKind;
using snapshot::Segment;
using html::VarintColumn;
using html::write_payload;

namespace {

// The page's event kinds: the model's, and one for another device's events,
// which change nothing here.
constexpr std::uint8_t kOtherDevice = 15;

bool has_address(EventKind kind) {
  switch (kind) {
    case EventKind::alloc:
    case EventKind::free_requested:
    case EventKind::free_completed:
    case EventKind::segment_alloc:
    case EventKind::segment_release:
    case EventKind::segment_map:
    case EventKind::segment_unmap:
      return true;
    default:
      return false;
  }
}

// The page's copy of one layout: segments in address order, each block by
// size (its address follows from the ones before it), state, and for active
// blocks the rounding (size - requested), the stack and the category.
struct KeyframeWriter {
  VarintColumn column;
  // Per keyframe: the event it precedes, its byte offset, the delta bases, and
  // the byte offsets of the event columns there, so the page starts decoding
  // at any keyframe without a scan.
  std::vector<std::array<std::uint64_t, 11>> index;
  std::size_t count = 0;
  std::size_t blocks = 0;
  // `address_base` and `time_base`: where the event columns' delta chains
  // stand before `before_event`, so the page can start decoding there.
  std::size_t write(std::size_t before_event, std::uint64_t address_base, std::uint64_t time_base,
                    const std::array<std::uint64_t, 7>& offsets, const std::vector<Segment>& layout,
                    const html::BlockCategories& categories) {
    index.push_back({before_event, column.bytes().size(), address_base, time_base, offsets[0], offsets[1], offsets[2],
                     offsets[3], offsets[4], offsets[5], offsets[6]});
    column.u(before_event);
    column.u(address_base);
    column.u(time_base);
    column.u(layout.size());
    // Each keyframe's segment addresses start their own delta chain: the page
    // decodes a keyframe alone, from the one nearest the event it shows.
    std::uint64_t previous_address = 0;
    std::size_t written = 0;
    for (const Segment& segment : layout) {
      column.delta(segment.address, previous_address);
      column.u(segment.total_size);
      column.u(segment.stream);
      column.u((segment.large_pool ? 1u : 0u) | (segment.expandable ? 2u : 0u));
      column.u(segment.stack.value);
      column.u(segment.blocks.size());
      for (const snapshot::Block& block : segment.blocks) {
        column.u(block.size);
        column.u(static_cast<std::uint8_t>(block.state));
        if (block.state == BlockState::active_allocated || block.state == BlockState::active_pending_free) {
          column.s(static_cast<std::int64_t>(block.size - block.requested));
          column.u(block.stack.value);
          column.u(categories.of(block.address));
        }
      }
      written += segment.blocks.size();
    }
    ++count;
    blocks += written;
    return written;
  }
};

struct Bucket {
  std::uint64_t first_time = 0;
  std::size_t first_event = 0, last_event = 0;
  Totals min, max;
  bool empty = true;
  void add(const Totals& t) {
    if (empty) {
      min = max = t;
      empty = false;
      return;
    }
    min.allocated = std::min(min.allocated, t.allocated);
    min.reserved = std::min(min.reserved, t.reserved);
    min.active = std::min(min.active, t.active);
    max.allocated = std::max(max.allocated, t.allocated);
    max.reserved = std::max(max.reserved, t.reserved);
    max.active = std::max(max.active, t.active);
  }
};

// Past the budget: windows around the allocated and reserved peaks, the
// first OOMs and the last events (one more pass, analyze(), finds them).
std::vector<html::DetailWindow> detail_windows(EventSource& source, std::int32_t device, std::size_t budget) {
  const std::size_t n = source.event_count();
  if (n <= budget) return html::plan_detail_windows(n, budget, {});
  AnalysisOptions options;
  options.device = device;
  const Analysis analysis = analyze(source, options);
  std::vector<html::DetailAnchor> anchors;
  auto peak = [&](const Peak& p, const char* reason) { anchors.push_back({p.event == kNoEvent ? 0 : p.event, reason}); };
  peak(analysis.peak_allocated, "the allocated peak");
  peak(analysis.peak_reserved, "the reserved peak");
  for (std::size_t k = 0; k < std::min<std::size_t>(2, analysis.ooms.size()); ++k)
    anchors.push_back({analysis.ooms[k].event, k == 0 ? "the first OOM" : "the second OOM"});
  anchors.push_back({n, "the last events"});
  return html::plan_detail_windows(n, budget, anchors);
}

std::string render_json(const Document& document) {
  std::ostringstream out;
  render(document, Format::json, out);
  return out.str();
}

}  // namespace

HtmlReportStats write_html_report(EventSource& source, const ReportOptions& options, const HtmlOptions& html,
                                  std::ostream& out) {
  const snapshot::Snapshot& head = source.head();
  const std::int32_t device = pick_device(source, options.device);
  ReportOptions whole = options;
  whole.device = device;
  whole.window = EventWindow{};  // the page shows the whole trace; the views select windows in it
  const std::string summary = render_json(summary_report(source, whole));
  const std::string oom = render_json(oom_report(source, whole));
  // The state before events[0], as segments --at and replay_to() take it,
  // found once for the categories walk and this page's own replay.
  CategorizeOptions from_start;
  from_start.start = std::make_shared<const InitialLayout>(confirmed_start(source, device));
  const InitialLayout& initial = *from_start.start;
  // A trace begun mid-run whose first events are annotations older than its
  // first memory event: the page draws no memory before that event.
  std::size_t ring_begins_at = initial.segments.empty() ? 0 : first_memory_event(source, device);
  if (ring_begins_at >= source.event_count()) ring_begins_at = 0;
  // What the memory is made of: the timeline stacks allocated by category.
  const Categorization categorization = categorize(source, device, from_start);

  Replay replay(initial.segments, device, head.stacks.size(), Replay::sizes_may_be_inferred(head, device));
  html::BlockCategories block_categories(categorization);

  const std::size_t n = source.event_count();
  HtmlReportStats stats;
  stats.events = n;
  VarintColumn kinds, addresses, sizes, auxes, stacks, streams, times;
  VarintColumn buckets;
  // Each bucket's events, for its bytes per category where allocated peaked.
  std::vector<std::pair<std::size_t, std::size_t>> bucket_ranges;
  KeyframeWriter keyframes;
  auto offsets = [&]() -> std::array<std::uint64_t, 7> {
    return {addresses.bytes().size(), sizes.bytes().size(),   auxes.bytes().size(), stacks.bytes().size(),
            streams.bytes().size(),   times.bytes().size(),   kinds.bytes().size()};
  };
  // Event-level columns and keyframes only inside these (all of a trace
  // within the budget); the delta chains run on across the gaps, and each
  // window opens with a keyframe holding the chains' bases.
  const std::vector<html::DetailWindow> windows = detail_windows(source, device, html.detail_events);
  std::size_t window_at = 0;  // the first window not yet behind the event
  auto in_detail = [&](std::size_t i) {
    while (window_at < windows.size() && windows[window_at].end <= i) ++window_at;
    return window_at < windows.size() && windows[window_at].begin <= i;
  };
  for (const html::DetailWindow& w : windows) stats.detail_events += w.end - w.begin;
  for (const html::DetailWindow& w : windows) stats.detail_windows.push_back(EventWindow{w.begin, w.end});
  const std::size_t max_buckets = std::max<std::size_t>(html.max_buckets, 1);
  const std::size_t bucket_events = std::max(kHtmlBucketEvents, (n + max_buckets - 1) / max_buckets);
  stats.bucket_events = bucket_events;
  // Allocations and their bytes per stack over the whole trace: the page's
  // first window, which it would otherwise decode every event for.
  std::vector<std::uint64_t> allocs_by_stack(head.stacks.size() + 1, 0), bytes_by_stack(head.stacks.size() + 1, 0);
  std::uint64_t previous_address = 0, previous_time = 0, time_origin = 0;
  std::size_t last_keyframe = 0;
  std::size_t next_keyframe_gap = 0;
  if (n == 0 || in_detail(0))
    next_keyframe_gap = std::max(kHtmlMinKeyframeGap, 4 * keyframes.write(0, 0, 0, offsets(), replay.layout(), block_categories));
  Bucket bucket;
  std::uint64_t bucket_previous[7] = {};
  auto flush_bucket = [&] {
    if (bucket.empty) return;
    bucket_ranges.emplace_back(bucket.first_event, bucket.last_event);
    const std::uint64_t values[7] = {bucket.first_time,   bucket.min.allocated, bucket.max.allocated,
                                     bucket.min.reserved, bucket.max.reserved,  bucket.min.active,
                                     bucket.max.active};
    for (int k = 0; k < 7; ++k) buckets.delta(values[k], bucket_previous[k]);
    ++stats.buckets;
    bucket = Bucket{};
  };
  const std::size_t sample_every = std::max<std::size_t>(1, (n + kHtmlFragmentationSamples - 1) / kHtmlFragmentationSamples);
  std::ostringstream fragmentation;
  JsonWriter frag(fragmentation);
  frag.begin_array();
  auto sample = [&](std::size_t after_event) {
    const CacheFigures f = replay.cache_figures();
    frag.begin_array();
    if (after_event == kNoEvent) frag.value(std::int64_t{-1});
    else frag.value(static_cast<std::uint64_t>(after_event));
    frag.value(f.external_fragmentation());
    frag.value(f.largest_free);
    frag.value(f.releasable);
    frag.value(f.cached_free);
    frag.end_array();
  };
  sample(kNoEvent);
  const Totals start_totals = replay.totals();

  struct OpenAnnotation {
    std::uint64_t name;
    std::size_t begin;
  };
  std::vector<OpenAnnotation> open;
  std::ostringstream markers;
  JsonWriter marks(markers);
  marks.begin_array();
  // Phase bands, as the page's strip draws them: the outermost two levels
  // (name, begin, length, depth; names and begins delta-coded, ~3 bytes a
  // band). Past the detail budget, outside the detail windows, only phases
  // of a bucket or longer: there the page draws buckets, and the bands stay
  // at most two per bucket whatever the trace's length.
  VarintColumn bands;
  std::vector<bool> band_names(head.strings.size(), false);  // the strings the page needs
  std::uint64_t previous_band_name = 0, previous_band_begin = 0;
  auto meets_detail = [&](std::size_t begin, std::size_t end) {
    for (const html::DetailWindow& w : windows)
      if (begin < w.end && end >= w.begin) return true;
    return false;
  };
  auto band = [&](const OpenAnnotation& a, std::size_t end, std::size_t depth) {
    if (depth > 1 || (stats.detail_events < n && end - a.begin + 1 < bucket_events && !meets_detail(a.begin, end))) return;
    if (a.name < band_names.size()) band_names[a.name] = true;
    bands.delta(a.name, previous_band_name);
    bands.delta(a.begin, previous_band_begin);
    bands.u(end - a.begin);
    bands.u(depth);
  };

  for_each_event(source, 0, n, [&](std::size_t i, const Event& e) {
    if (i == 0) previous_time = time_origin = e.time_ns;
    const bool detail = in_detail(i);
    const bool mine = e.device == device;
    const bool global = e.kind == EventKind::annotation_begin || e.kind == EventKind::annotation_end;
    // An alloc's category rides in the high bits of its kind byte (kinds
    // take 4 bits, categories 3): still one byte an event.
    std::uint8_t kind_byte = mine || global ? static_cast<std::uint8_t>(e.kind) : kOtherDevice;
    const std::uint8_t category = block_categories.on_event(i, e);
    if (mine && e.kind == EventKind::alloc) kind_byte |= static_cast<std::uint8_t>(category << 4);
    if (detail) {
      kinds.u(kind_byte);
      times.s(static_cast<std::int64_t>(e.time_ns - previous_time));
      if (mine && has_address(e.kind)) addresses.delta(e.address, previous_address);
    }
    previous_time = e.time_ns;
    if (mine && e.kind == EventKind::alloc && e.stack.value < allocs_by_stack.size()) {
      ++allocs_by_stack[e.stack.value];
      bytes_by_stack[e.stack.value] += e.size;
    }
    if (mine && detail) {
      switch (e.kind) {
        case EventKind::alloc:
          sizes.u(e.size);
          auxes.s(static_cast<std::int64_t>(e.size - e.aux));
          stacks.u(e.stack.value);
          break;
        case EventKind::segment_alloc:
        case EventKind::segment_map:
          sizes.u(e.size);
          auxes.u(e.aux);
          stacks.u(e.stack.value);
          streams.u(e.stream);
          break;
        case EventKind::segment_unmap:
          sizes.u(e.size);
          break;
        default:
          break;
      }
    }
    if (mine && (e.kind == EventKind::oom || e.kind == EventKind::empty_cache)) {
      marks.begin_array();
      marks.value(e.kind == EventKind::oom ? "oom" : "empty_cache");
      marks.value(static_cast<std::uint64_t>(i));
      marks.value(e.size);
      marks.end_array();
    }
    if (e.kind == EventKind::annotation_begin) {
      open.push_back(OpenAnnotation{e.aux, i});
    } else if (e.kind == EventKind::annotation_end) {
      for (std::size_t k = open.size(); k-- > 0;) {
        if (open[k].name == e.aux) {
          band(open[k], i, k);
          open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
          break;
        }
      }
    }
    replay.apply(e);
    if (bucket.empty) {
      bucket.first_time = e.time_ns - time_origin;
      bucket.first_event = i;
    }
    bucket.last_event = i;
    bucket.add(replay.totals());
    if ((i + 1) % bucket_events == 0) flush_bucket();
    if ((i + 1) % sample_every == 0 || i + 1 == n) sample(i);
    // A keyframe holds the state before event i + 1.
    // A detail window opens with one, so the page starts decoding there.
    const bool opens = i + 1 < n && !detail && in_detail(i + 1);
    if (opens || (i + 1 < n && detail && in_detail(i + 1) && i + 1 - last_keyframe >= next_keyframe_gap)) {
      last_keyframe = i + 1;
      next_keyframe_gap = std::max(kHtmlMinKeyframeGap, 4 * keyframes.write(i + 1, previous_address, previous_time - time_origin, offsets(), replay.layout(), block_categories));
    }
    if (options.progress && (i + 1) % (std::size_t{1} << 16) == 0) options.progress(i + 1, n);
    return true;
  });
  flush_bucket();
  // Per bucket, the bytes of each category where allocated peaked in it
  // (they add up to the bucket's max allocated), delta-coded by category.
  VarintColumn bucket_categories;
  {
    std::array<std::uint64_t, kCategoryCount> previous{};
    for (const CategoryBytes& at_max : categorization.at_allocated_max(bucket_ranges))
      for (std::size_t c = 0; c < kCategoryCount; ++c) bucket_categories.delta(at_max.bytes[c], previous[c]);
  }
  for (std::size_t k = 0; k < open.size(); ++k) band(open[k], n == 0 ? 0 : n - 1, k);
  marks.end_array();
  frag.end_array();
  stats.keyframes = keyframes.count;
  stats.keyframe_blocks = keyframes.blocks;

  // Names: the strings annotations use, and each stack's site under the
  // SiteFilter with its printed frames, as top and segments print them.
  SiteNamer names(head, options.sites);
  std::ostringstream meta_text;
  JsonWriter meta(meta_text);
  meta.begin_object();
  meta.key("format_version");
  meta.value(std::uint64_t{1});
  meta.key("title");
  meta.value(detail::title(head, device, "memory report"));
  meta.key("device");
  meta.value(static_cast<std::int64_t>(device));
  meta.key("events");
  meta.value(static_cast<std::uint64_t>(n));
  meta.key("exact_events");
  meta.value(static_cast<std::uint64_t>(html.exact_events));
  // The page's layout applies the allocator's rule where sizes may be
  // inferred, as Replay does (replay.hpp).
  meta.key("inferred_sizes");
  meta.value(Replay::sizes_may_be_inferred(head, device));
  meta.key("ring_begins_at");
  meta.value(static_cast<std::uint64_t>(ring_begins_at));
  meta.key("bucket_events");
  meta.value(static_cast<std::uint64_t>(bucket_events));
  meta.key("detail_budget");
  meta.value(static_cast<std::uint64_t>(html.detail_events));
  meta.key("detail_windows");  // [first event, last event, [why]], in event order
  meta.begin_array();
  for (const html::DetailWindow& w : windows) {
    meta.begin_array();
    meta.value(static_cast<std::uint64_t>(w.begin));
    meta.value(static_cast<std::uint64_t>(w.end - 1));
    meta.begin_array();
    for (const std::string& reason : w.reasons) meta.value(reason);
    meta.end_array();
    meta.end_array();
  }
  meta.end_array();
  meta.key("buckets");
  meta.value(static_cast<std::uint64_t>(stats.buckets));
  meta.key("categories");  // [key, label, inferred], in Category order
  meta.begin_array();
  {
    // Inferred unless every allocation of the category came from torch's own state.
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      meta.begin_array();
      meta.value(category_key(static_cast<Category>(c)));
      meta.value(category_label(static_cast<Category>(c)));
      meta.value(categorization.inferred(static_cast<Category>(c)));
      meta.end_array();
    }
  }
  meta.end_array();
  meta.key("keyframes");
  meta.value(static_cast<std::uint64_t>(keyframes.count));
  meta.key("start");
  meta.begin_array();
  meta.value(start_totals.allocated);
  meta.value(start_totals.reserved);
  meta.value(start_totals.active);
  meta.end_array();
  meta.key("strings");
  meta.begin_array();
  for (std::size_t k = 0; k < head.strings.size(); ++k) meta.value(band_names[k] ? head.strings[k] : std::string());
  meta.end_array();
  // Sites in the order of their representative StackId (top's tie-break).
  std::map<std::uint32_t, std::uint32_t> site_of_representative;
  std::vector<std::uint32_t> stack_site(head.stacks.size() + 1, 0);
  for (std::uint32_t s = 0; s < head.stacks.size(); ++s)
    site_of_representative.emplace(names.representative(snapshot::StackId{s}).value, 0);
  if (head.stacks.empty()) site_of_representative.emplace(0, 0);
  std::uint32_t next_site = 0;
  for (auto& [representative, site] : site_of_representative) site = next_site++;
  for (std::uint32_t s = 0; s < head.stacks.size(); ++s)
    stack_site[s] = site_of_representative[names.representative(snapshot::StackId{s}).value];
  meta.key("sites");
  meta.begin_array();
  for (const auto& [representative, site] : site_of_representative) {
    meta.begin_array();
    for (const std::string& line : names.lines(snapshot::StackId{representative})) meta.value(line);
    meta.end_array();
  }
  meta.end_array();
  meta.key("stack_site");
  meta.begin_array();
  for (std::uint32_t s = 0; s < std::max<std::size_t>(head.stacks.size(), 1); ++s) meta.value(std::uint64_t{stack_site[s]});
  meta.end_array();
  meta.key("keyframe_index");
  meta.begin_array();
  for (const auto& row : keyframes.index) {
    meta.begin_array();
    for (const std::uint64_t v : row) meta.value(v);
    meta.end_array();
  }
  meta.end_array();
  {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> by_site(next_site, {0, 0});
    for (std::uint32_t s = 0; s < head.stacks.size(); ++s) {
      by_site[stack_site[s]].first += allocs_by_stack[s];
      by_site[stack_site[s]].second += bytes_by_stack[s];
    }
    meta.key("sites_whole_trace");  // [site, allocations, bytes], as top over the whole trace
    meta.begin_array();
    for (std::uint32_t site = 0; site < by_site.size(); ++site) {
      if (by_site[site].first == 0) continue;
      meta.begin_array();
      meta.value(std::uint64_t{site});
      meta.value(by_site[site].first);
      meta.value(by_site[site].second);
      meta.end_array();
    }
    meta.end_array();
  }
  meta.end_object();
  const std::string meta_json = meta_text.str();
  const std::string fragmentation_json = fragmentation.str();
  const std::string markers_json = markers.str();

  std::ostringstream page;
  page << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
          "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
          // Everything is inline; the policy forbids the page any request.
          "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
          "style-src 'unsafe-inline'; img-src data:\">\n"
          "<title>cachealloc memory report</title>\n<style>\n"
       << assets::kUplotCss << "\n" << assets::kReportCss << "\n</style>\n</head><body>\n"
       << "<div id=\"app\">Loading the report&hellip;</div>\n";
  write_payload(page, "data-meta", meta_json);
  write_payload(page, "data-summary", summary);
  write_payload(page, "data-oom", oom);
  write_payload(page, "data-fragmentation", fragmentation_json);
  write_payload(page, "data-annotations", bands.bytes());
  write_payload(page, "data-markers", markers_json);
  write_payload(page, "data-kinds", kinds.bytes());
  write_payload(page, "data-addresses", addresses.bytes());
  write_payload(page, "data-sizes", sizes.bytes());
  write_payload(page, "data-auxes", auxes.bytes());
  write_payload(page, "data-stacks", stacks.bytes());
  write_payload(page, "data-streams", streams.bytes());
  write_payload(page, "data-times", times.bytes());
  write_payload(page, "data-buckets", buckets.bytes());
  write_payload(page, "data-bucket-categories", bucket_categories.bytes());
  write_payload(page, "data-keyframes", keyframes.column.bytes());
  page << "<script>\n" << assets::kUplotJs << "\n</script>\n<script>\n";
  for (const std::string_view part : assets::kReportScriptParts) page << part << "\n";
  page << "</script>\n</body></html>\n";
  const std::string text = page.str();
  stats.bytes = text.size();
  out << text;
  return stats;
}

}  // namespace cachealloc::analyzer
