#include "cachealloc/analyzer/analysis.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>

#include "cachealloc/analyzer/document.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/errors.hpp"
#include "cachealloc/snapshot/detail/cores.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "cachealloc/snapshot/ring_start.hpp"
#include "core/analysis_pass.hpp"
#include "core/analysis_parallel.hpp"
#include "core/replay_hot.hpp"

namespace cachealloc::analyzer {

using snapshot::Event;
using snapshot::EventKind;
using snapshot::Segment;
using snapshot::Snapshot;
using pass::counts_for;

namespace {

std::vector<Segment> stored_layout(const Snapshot& snapshot, std::int32_t device) {
  std::vector<Segment> result;
  for (const Segment& segment : snapshot.segments) {
    if (segment.device == device) result.push_back(segment);
  }
  std::sort(result.begin(), result.end(), [](const Segment& a, const Segment& b) { return a.address < b.address; });
  return result;
}

}  // namespace

namespace {

// What a time names: the first event at or after it (where a window
// begins), or the first event after it (where a state or window ends, so
// that events at exactly that time are in).
enum class TimeEdge { at_or_after, after };

std::optional<std::size_t> parse_point(EventSource& source, std::string_view text, std::string& error, TimeEdge edge,
                                       bool& is_time) {
  is_time = false;
  const std::size_t n = source.event_count();
  const std::string original(text);
  if (text.empty()) {
    error = "empty event or time";
    return std::nullopt;
  }
  struct Unit {
    std::string_view suffix;
    double ns;
  };
  static constexpr Unit kUnits[] = {{"ns", 1.0}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}};
  for (const Unit& unit : kUnits) {
    if (text.size() <= unit.suffix.size() || !text.ends_with(unit.suffix)) continue;
    const std::string number(text.substr(0, text.size() - unit.suffix.size()));
    char* end = nullptr;
    const double value = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size() || !(value >= 0) || !std::isfinite(value)) break;
    is_time = true;
    if (n == 0) return 0;
    const std::uint64_t target =
        source.block(0).front().time_ns + static_cast<std::uint64_t>(std::llround(value * unit.ns));
    // A lower_bound over the whole trace, one block at a time: blocks that
    // end before the target are skipped after one comparison.
    for (std::size_t b = 0; b < source.block_count(); ++b) {
      const std::span<const Event> events = source.block(b);
      if (edge == TimeEdge::at_or_after) {
        if (events.empty() || events.back().time_ns < target) continue;
        const auto it = std::lower_bound(events.begin(), events.end(), target,
                                         [](const Event& e, std::uint64_t t) { return e.time_ns < t; });
        return source.block_begin(b) + static_cast<std::size_t>(it - events.begin());
      }
      if (events.empty() || events.back().time_ns <= target) continue;
      const auto it = std::upper_bound(events.begin(), events.end(), target,
                                       [](std::uint64_t t, const Event& e) { return t < e.time_ns; });
      return source.block_begin(b) + static_cast<std::size_t>(it - events.begin());
    }
    return n;
  }
  std::size_t index = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), index);
  if (ec != std::errc{} || ptr != text.data() + text.size()) {
    error = "'" + original + "' is neither an event index nor a time such as 1.5s, 200ms, 10us or 5ns";
    return std::nullopt;
  }
  return std::min(index, n);
}

}  // namespace

std::optional<std::size_t> parse_event_point(EventSource& source, std::string_view text, std::string& error) {
  bool is_time = false;
  return parse_point(source, text, error, TimeEdge::at_or_after, is_time);
}

namespace {

// An event of the device's memory: not an annotation (nor another device's).
bool is_memory_event(const Event& e, std::int32_t device) noexcept {
  return e.device == device && e.kind != snapshot::EventKind::annotation_begin &&
         e.kind != snapshot::EventKind::annotation_end;
}

// The index in `events` of the first of them that is a memory event of the
// device, or events.size().
std::size_t first_memory_in(std::span<const Event> events, std::int32_t device) noexcept {
  std::size_t j = 0;
  while (j < events.size() && !is_memory_event(events[j], device)) ++j;
  return j;
}

// A copy: a block's span lasts only until the source reads another block.
std::optional<Event> event_at(EventSource& source, std::size_t index) {
  if (index >= source.event_count()) return std::nullopt;
  std::size_t lo = 0, hi = source.block_count();  // the last block that begins at or before index
  while (hi - lo > 1) {
    const std::size_t mid = (lo + hi) / 2;
    (source.block_begin(mid) <= index ? lo : hi) = mid;
  }
  const std::span<const Event> events = source.block(lo);
  const std::size_t at = index - source.block_begin(lo);
  if (at >= events.size()) return std::nullopt;
  return events[at];
}

// A free that waited for no stream is one call in PyTorch (free() runs
// free_block() at once): its free_requested and free_completed are
// consecutive, and no state lies between them. A state that would end
// between the two ends after both, so no report shows that free as pending,
// nor requested above allocated.
std::size_t after_plain_free(EventSource& source, std::size_t end) {
  if (end == 0) return end;
  const std::optional<Event> last = event_at(source, end - 1);
  const std::optional<Event> next = event_at(source, end);
  if (!last || !next) return end;
  const bool pair = last->kind == snapshot::EventKind::free_requested &&
                    next->kind == snapshot::EventKind::free_completed && next->address == last->address &&
                    next->device == last->device;
  return pair ? end + 1 : end;
}

}  // namespace

std::optional<std::size_t> parse_state_end(EventSource& source, std::string_view text, std::string& error) {
  bool is_time = false;
  const std::optional<std::size_t> point = parse_point(source, text, error, TimeEdge::after, is_time);
  if (!point) return point;
  // An index is the event itself: it is in.
  return after_plain_free(source, is_time ? *point : std::min(*point + 1, source.event_count()));
}

std::optional<std::size_t> parse_event_point(const Snapshot& snapshot, std::string_view text, std::string& error) {
  SnapshotEvents source(snapshot);
  return parse_event_point(source, text, error);
}

std::int32_t pick_device(EventSource& source, std::int32_t requested) {
  if (requested >= 0) return requested;
  const Snapshot& head = source.head();
  if (!head.devices.empty()) return head.devices.front().index;
  for (std::size_t b = 0; b < source.block_count(); ++b) {
    for (const Event& event : source.block(b)) {
      if (!counts_for(event, -1)) return event.device;
    }
  }
  if (!head.segments.empty()) return head.segments.front().device;
  return 0;
}

std::size_t first_memory_event(EventSource& source, std::int32_t device, std::uint64_t* time_ns) {
  for (std::size_t b = 0; b < source.block_count(); ++b) {
    const std::span<const Event> events = source.block(b);
    if (const std::size_t j = first_memory_in(events, device); j < events.size()) {
      if (time_ns != nullptr) *time_ns = events[j].time_ns;
      return source.block_begin(b) + j;
    }
  }
  return source.event_count();
}

std::int32_t pick_device(const Snapshot& snapshot, std::int32_t requested) {
  SnapshotEvents source(snapshot);
  return pick_device(source, requested);
}

namespace {

// Applies events [begin, end) to `replay`, reading only the blocks that hold them.
void replay_range(EventSource& source, Replay& replay, std::size_t begin, std::size_t end,
                  const std::function<void(std::size_t, std::size_t)>& progress) {
  for (std::size_t b = 0; b < source.block_count() && source.block_begin(b) < end; ++b) {
    const std::size_t base = source.block_begin(b);
    if (source.block_begin(b + 1) <= begin) continue;
    const std::span<const Event> events = source.block(b);
    const std::size_t stop = std::min(events.size(), end - base);
    for (std::size_t j = begin > base ? begin - base : 0; j < stop; ++j) replay.apply_inline(events[j]);
    if (progress) progress(base + stop, source.event_count());
  }
}

// Whether the events, replayed from a guessed start, explain themselves and
// end in the stored final layout: then the guess is as good as the derived
// start, which is what a reader needs from it.
bool explains_the_trace(const Replay& replay, const Snapshot& head, std::int32_t device) {
  if (replay.anomalies().total() != 0) return false;
  std::size_t differences = 0;
  compare_layouts(replay.layout(), stored_layout(head, device), 0, differences);
  return differences == 0;
}

// AnalysisOptions::threads == 0: one thread per core this process may run on
// (its CPU affinity mask, not every online core), from kRangesFromCores
// cores up; below that, one, since the one-thread pass with its blocks
// decoded ahead on the other cores (FileEvents) is faster there: ranges
// decode every event twice (on the H200's host 4 threads in ranges give
// 33.6 M events/s against 45 for one thread with 4 decoding, 8 threads 62.7;
// on a 2-core x86 machine 31-32 against 35-47; docs/PERFORMANCE.md,
// "Analyzer").
constexpr unsigned kRangesFromCores = 6;
unsigned automatic_threads() noexcept {
  const unsigned cores = snapshot::detail::usable_cores();
  return cores >= kRangesFromCores ? cores : 1;
}

// `start_explains`, when not null, is set to whether the trace replayed from
// `initial` explains itself to its end (explains_the_trace); a window that
// ends early then costs a replay of the rest, which leaves the Analysis as
// it was at the window's end.
Analysis run_analysis(EventSource& source, const AnalysisOptions& options, std::int32_t device,
                      const std::shared_ptr<const InitialLayout>& start, bool* start_explains = nullptr) {
  InitialLayout initial = *start;
  const Snapshot& head = source.head();
  Analysis a;
  a.device = device;
  a.dropped_events = head.dropped_events;
  // Sizes the reader inferred, and exact ones the final layout contradicted
  // (PyTorch's layout then departed from the replayed policy): both make the
  // figures that depend on them bounds.
  for (const char* key : {snapshot::kInferredBlockSizesSetting, snapshot::kContradictedBlockSizesSetting})
    a.inferred_block_sizes += snapshot::block_size_count(head, key, device);
  if (const auto policy = head.settings.find("block_sizes.policy"); policy != head.settings.end())
    a.block_policy_assumed = policy->second.starts_with("defaults");
  const std::size_t n = source.event_count();
  a.event_count = n;
  a.window.end = std::min(options.window.end, n);
  a.window.begin = std::min(options.window.begin, a.window.end);

  a.blocks_from_before_ring = initial.blocks_from_before_ring;
  a.starts_mid_run = !initial.segments.empty();
  // Block 0, read once where the trace begins mid-run: the ring's first
  // memory event is looked for there, and the serial pass starts with it.
  std::span<const Event> first_block;
  bool first_block_held = false;
  if (a.starts_mid_run && source.block_count() > 0) {
    first_block = source.block(0);
    first_block_held = true;
    std::size_t first = first_memory_in(first_block, device);
    if (first < first_block.size()) {
      a.ring_begins_time_ns = first_block[first].time_ns;
    } else {
      first = first_memory_event(source, device, &a.ring_begins_time_ns);  // rare: a block of annotations
      first_block_held = false;
    }
    if (first > 0 && first < n) a.ring_begins_at = first;
  }
  if (a.ring_begins_at != 0 && options.window_from_ring && a.window.begin < a.ring_begins_at) {
    // A window of annotations alone, from before the memory was recorded,
    // has no figures to show: the ones at the ring's start would be wrong there.
    if (a.window.end <= a.ring_begins_at) {
      const std::string first = "#" + std::to_string(a.ring_begins_at);
      throw InvalidArgument("events #" + std::to_string(a.window.begin) + " to #" + std::to_string(a.window.end - 1) +
                            " come before the ring's first memory event " + first + " (" +
                            format_time(a.ring_begins_time_ns - event_at(source, 0)->time_ns) +
                            "): the trace begins mid-run and recorded none of this device's memory then; ask for " +
                            first + " or later");
    }
    a.window.begin = a.ring_begins_at;
    a.window_cut_to_ring = true;
  }
  a.unplaced_blocks = initial.unplaced_blocks;
  a.sites.resize(head.stacks.size());

  // What follows the pass, serial or parallel: the state at the end, the
  // sites' figures at the peaks and at the end, and the layout check.
  auto finish = [&](Analysis& out, Replay& replay, const pass::SitePeakTracker& at_peak_allocated,
                    const pass::SitePeakTracker& at_peak_reserved) {
    out.totals_at_end = replay.totals();
    out.cache_at_end = replay.cache_figures();
    if (options.at_end) options.at_end(replay);
    const auto& live = replay.live_bytes_by_stack();
    const auto& live_blocks = replay.live_blocks_by_stack();
    if (out.sites.size() < live.size()) out.sites.resize(live.size());
    for (std::uint32_t s = 0; s < out.sites.size(); ++s) {
      SiteFigures& site = out.sites[s];
      site.stack = snapshot::StackId{s};
      if (s < live.size()) {
        site.live_bytes_at_end = live[s];
        site.live_blocks_at_end = live_blocks[s];
      }
      if (s < at_peak_allocated.bytes().size()) {
        site.bytes_at_peak_allocated = at_peak_allocated.bytes()[s];
        site.blocks_at_peak_allocated = at_peak_allocated.blocks()[s];
      }
      if (s < at_peak_reserved.bytes().size()) {
        site.bytes_at_peak_reserved = at_peak_reserved.bytes()[s];
        site.blocks_at_peak_reserved = at_peak_reserved.blocks()[s];
      }
    }
    out.anomalies = replay.anomalies();
    std::vector<Segment> replayed = replay.layout();
    out.expandable_segments_at_end = static_cast<std::size_t>(
        std::count_if(replayed.begin(), replayed.end(), [](const Segment& segment) { return segment.expandable; }));
    out.segments_at_end = replayed.size() - out.expandable_segments_at_end;
    if (out.window.end == n) {
      out.layout_check.checked = true;
      out.layout_check.first_differences =
          compare_layouts(replayed, stored_layout(head, out.device), 5, out.layout_check.differences);
      if (start_explains != nullptr)
        *start_explains = out.anomalies.total() == 0 && out.layout_check.differences == 0;
    } else if (start_explains != nullptr) {
      replay_range(source, replay, out.window.end, n, {});
      *start_explains = explains_the_trace(replay, head, out.device);
    }
  };

  // A categories walk follows one replay in order: in ranges it would read
  // every event again afterwards, alone (categories_of), which costs more
  // than the ranges save. So the automatic choice, for a report that takes
  // its categories in the pass (summary, timeline, peak), is the one pass,
  // its blocks decoded ahead on the other cores (FileEvents).
  // (The window of a trace begun mid-run starts at the ring's first memory
  // event: the walk hears the annotations before it as well.)
  const bool walk_in_pass =
      options.categories && a.window.begin == (a.window_cut_to_ring ? a.ring_begins_at : 0) && a.window.end == n;
  const unsigned threads = options.threads != 0 ? options.threads : walk_in_pass ? 1 : automatic_threads();
  // Ranges take each alloc's size as the file gives it: where sizes may be
  // inferred, only the one-thread pass applies the allocator's rule.
  if (threads > 1 && !Replay::sizes_may_be_inferred(head, device)) {
    first_block_held = false;  // the ranges read blocks of their own
    Analysis parallel_a = a;
    if (parallel::run(source, options, initial, threads, parallel_a, finish)) return parallel_a;
  }

  Replay replay(initial.segments, a.device, head.stacks.size(), Replay::sizes_may_be_inferred(head, device));
  initial.segments.clear();
  initial.segments.shrink_to_fit();
  pass::WindowPass pass(options, a, replay);
  std::optional<categories::SharedWalk> categories_walk;
  if (walk_in_pass) {
    categories_walk.emplace(source, a.device, replay, options.category_changes);
    pass.share_replay_with(&*categories_walk);
  }

  // Events before the window only build up state; reading stops after the
  // window's last event.
  bool started = false;
  for (std::size_t b = 0; b < source.block_count(); ++b) {
    const std::size_t base = source.block_begin(b);
    if (started && base >= a.window.end) break;
    const std::span<const Event> events = b == 0 && first_block_held ? first_block : source.block(b);
    if (b == 0 && !events.empty()) a.time_origin_ns = events.front().time_ns;
    const std::size_t length = events.size();
    std::size_t j = 0;
    const std::size_t before = a.window.begin > base ? std::min(a.window.begin - base, length) : 0;
    if (categories_walk) {
      for (; j < before; ++j) {
        categories_walk->before(base + j, events[j]);
        replay.apply_inline(events[j]);
        categories_walk->after(base + j, events[j]);
      }
    }
    for (; j < before; ++j) replay.apply_inline(events[j]);
    if (!started && a.window.begin < base + length) {
      pass.start_window(events[a.window.begin - base].time_ns);
      started = true;
    }
    const std::size_t inside = a.window.end > base ? std::min(a.window.end - base, length) : 0;
    if (categories_walk) {
      for (; j < inside; ++j) pass.step<true>(base + j, events[j]);
    } else {
      for (; j < inside; ++j) pass.step(base + j, events[j]);
    }
    if (options.progress) options.progress(base + length, n);
  }
  if (!started) pass.start_window(a.time_origin_ns);
  pass.end_window();
  pass.finish();
  if (options.progress) options.progress(n, n);

  finish(a, replay, pass.at_peak_allocated, pass.at_peak_reserved);
  if (options.live_at_peak != AnalysisOptions::LiveAtPeak::none && pass.live_at_peak.consistent() &&
      a.anomalies.total() == 0 && replay.overlapping_segments() == 0)
    a.live_at_peak = pass.live_at_peak.blocks();
  if (categories_walk) a.categories = categories_walk->finish(a, start);
  return a;
}

// The start that costs nothing to try: the one the file stores (format
// version 4, when the ring overflowed), else, for a ring that never
// overflowed, the empty allocator. It holds only once the events confirm it.
std::optional<InitialLayout> start_guess(const Snapshot& head, std::int32_t device) {
  if (const snapshot::RingStart* stored = snapshot::find_ring_start(head, device)) return *stored;
  if (head.dropped_events == 0) return InitialLayout{device, {}, 0, 0};
  return std::nullopt;
}

}  // namespace

Analysis analyze(EventSource& source, const AnalysisOptions& options) {
  const std::int32_t device = pick_device(source, options.device);
  const Snapshot& head = source.head();
  // Deriving the start costs a backward pass over the events: for a streamed
  // file, decoding every block a second time. So first try a start that
  // costs nothing: the one the file stores (format version 4, when the ring
  // overflowed), else, for a ring that never overflowed, the empty allocator
  // (a window that ends early replays the rest to check it at the end).
  // A guess counts only when the events confirm it (explains_the_trace): a
  // derived start could invent memory that was never there (20 MiB of
  // reserved for a PyTorch trace of expandable segments cut at its peak).
  const std::optional<InitialLayout> guess = start_guess(head, device);
  const auto analyze_from = [&](std::shared_ptr<const InitialLayout> start) {
    Analysis a = run_analysis(source, options, device, start);
    a.start = std::move(start);
    return a;
  };
  if (!guess) return analyze_from(std::make_shared<const InitialLayout>(derive_initial_layout(source, device)));

  // at_end sees the state only once the guess holds: keep a copy until then.
  AnalysisOptions guess_options = options;
  std::optional<Replay> at_end;
  if (options.at_end) guess_options.at_end = [&](const Replay& replay) { at_end.emplace(replay); };
  bool explains = false;
  auto guessed_start = std::make_shared<const InitialLayout>(*guess);
  Analysis a = run_analysis(source, guess_options, device, guessed_start, &explains);
  InitialLayout derived;
  // A trace that contradicts itself from the derived start too: the guess
  // was that start, and its analysis is the answer.
  if (!explains) derived = derive_initial_layout(source, device);
  if (explains || derived == *guess) {
    if (at_end) options.at_end(*at_end);
    a.start = std::move(guessed_start);
    return a;
  }
  return analyze_from(std::make_shared<const InitialLayout>(std::move(derived)));
}

Analysis analyze(const Snapshot& snapshot, const AnalysisOptions& options) {
  SnapshotEvents source(snapshot);
  return analyze(source, options);
}

void replay_to(EventSource& source, std::int32_t device, std::size_t index,
               const std::function<void(const Replay&)>& inspect,
               const std::function<void(std::size_t, std::size_t)>& progress) {
  const Snapshot& head = source.head();
  const std::size_t n = source.event_count();
  const std::size_t end = index == kNoEvent ? 0 : std::min(index + 1, n);
  InitialLayout derived;
  // The start the file stores, else for a ring that never overflowed the
  // empty allocator, as analyze() takes it: each holds when the events
  // confirm it.
  const std::optional<InitialLayout> guess = start_guess(head, device);
  if (guess) {
    // Replay on to the end, keeping a copy of the state after `index`
    // (O(live blocks)).
    Replay replay(guess->segments, device, head.stacks.size(), Replay::sizes_may_be_inferred(head, device));
    replay_range(source, replay, 0, end, progress);
    std::optional<Replay> at;
    if (end < n) {
      at.emplace(replay);
      replay_range(source, replay, end, n, progress);
    }
    const bool explains = explains_the_trace(replay, head, device);
    if (!explains) derived = derive_initial_layout(source, device);
    if (explains || derived == *guess) {
      if (progress) progress(n, n);
      inspect(at ? *at : replay);
      return;
    }
  } else {
    derived = derive_initial_layout(source, device);
  }
  Replay replay(derived.segments, device, head.stacks.size(), Replay::sizes_may_be_inferred(head, device));
  replay_range(source, replay, 0, end, progress);
  if (progress) progress(n, n);
  inspect(replay);
}

InitialLayout confirmed_start(EventSource& source, std::int32_t device) {
  const Snapshot& head = source.head();
  const std::optional<InitialLayout> guess = start_guess(head, device);
  if (guess) {
    Replay replay(guess->segments, device, head.stacks.size(), Replay::sizes_may_be_inferred(head, device));
    replay_range(source, replay, 0, source.event_count(), {});
    if (explains_the_trace(replay, head, device)) return *guess;
  }
  return derive_initial_layout(source, device);
}

void replay_to(const Snapshot& snapshot, std::int32_t device, std::size_t index,
               const std::function<void(const Replay&)>& inspect,
               const std::function<void(std::size_t, std::size_t)>& progress) {
  SnapshotEvents source(snapshot);
  replay_to(source, device, index, inspect, progress);
}

namespace {

// Expandable segments have two spellings: one segment with unmapped blocks
// (our model), or one segment per mapped range (PyTorch's snapshots). Compare
// in the second: split at unmapped blocks, drop them.
std::vector<Segment> mapped_ranges(const std::vector<Segment>& layout) {
  std::vector<Segment> result;
  for (const Segment& segment : layout) {
    if (!segment.expandable) {
      result.push_back(segment);
      continue;
    }
    Segment piece = segment;
    piece.blocks.clear();
    auto flush = [&] {
      if (piece.blocks.empty()) return;
      piece.address = piece.blocks.front().address;
      piece.total_size = piece.blocks.back().address + piece.blocks.back().size - piece.address;
      result.push_back(piece);
      piece.blocks.clear();
    };
    for (const snapshot::Block& block : segment.blocks) {
      if (block.state == snapshot::BlockState::unmapped) {
        flush();
      } else if (!piece.blocks.empty() && piece.blocks.back().address + piece.blocks.back().size != block.address) {
        flush();
        piece.blocks.push_back(block);
      } else {
        piece.blocks.push_back(block);
      }
    }
    flush();
  }
  std::sort(result.begin(), result.end(), [](const Segment& a, const Segment& b) { return a.address < b.address; });
  return result;
}

}  // namespace

std::vector<std::string> compare_layouts(const std::vector<Segment>& replayed_layout,
                                         const std::vector<Segment>& stored_layout, std::size_t limit,
                                         std::size_t& count) {
  const std::vector<Segment> replayed = mapped_ranges(replayed_layout);
  const std::vector<Segment> stored = mapped_ranges(stored_layout);
  std::vector<std::string> lines;
  count = 0;
  auto note = [&](const std::string& line) {
    ++count;
    if (lines.size() < limit) lines.push_back(line);
  };
  auto hex = [](std::uint64_t value) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "0x%llx", static_cast<unsigned long long>(value));
    return std::string(buffer);
  };
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < replayed.size() || j < stored.size()) {
    if (j == stored.size() || (i < replayed.size() && replayed[i].address < stored[j].address)) {
      note("segment " + hex(replayed[i].address) + " replayed but not stored");
      ++i;
      continue;
    }
    if (i == replayed.size() || stored[j].address < replayed[i].address) {
      note("segment " + hex(stored[j].address) + " stored but not replayed");
      ++j;
      continue;
    }
    const Segment& r = replayed[i++];
    const Segment& s = stored[j++];
    if (r.total_size != s.total_size || r.large_pool != s.large_pool || r.expandable != s.expandable ||
        r.stream != s.stream) {
      note("segment " + hex(r.address) + " differs in size, pool, stream or kind");
      continue;
    }
    bool same = r.blocks.size() == s.blocks.size();
    for (std::size_t k = 0; same && k < r.blocks.size(); ++k) {
      const snapshot::Block& x = r.blocks[k];
      const snapshot::Block& y = s.blocks[k];
      same = x.address == y.address && x.size == y.size && x.state == y.state &&
             (x.state == snapshot::BlockState::inactive || x.state == snapshot::BlockState::unmapped ||
              (x.requested == y.requested && x.stack == y.stack));
    }
    if (!same) note("segment " + hex(r.address) + " has different blocks");
  }
  return lines;
}

}  // namespace cachealloc::analyzer
