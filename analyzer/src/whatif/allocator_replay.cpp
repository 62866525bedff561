// replay_allocator: the steps of a what-if replay, in order. Each step's
// parts live in their own files (replay_parts.hpp lists them).
#include <algorithm>

#include "cachealloc/analyzer/allocator_replay.hpp"

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/errors.hpp"
#include "whatif/replay_parts.hpp"

namespace cachealloc::analyzer {

namespace {

using namespace whatif;

// The device to replay, and its events; a file without a trace has no
// requests to replay.
ReplayResult start_result(EventSource& source, const AllocatorReplayOptions& options) {
  ReplayResult result;
  result.device = pick_device(source, options.device);
  result.events = source.event_count();
  if (result.events == 0)
    throw InvalidArgument("the file holds no trace (segments only): there are no requests to replay");
  return result;
}

// The settings the recording ran under, and those the replay runs under:
// options.config whole, else each --set pair over the recorded ones.
struct Settings {
  AllocatorConfig recorded;
  AllocatorConfig replayed;
};
Settings settings_of(const snapshot::Snapshot& head, const AllocatorReplayOptions& options, ReplayResult& result) {
  Settings settings;
  settings.recorded = recorded_settings(head, result.settings_known);
  if (!result.settings_known)
    result.notes.push_back("the file holds no allocator settings: PyTorch's defaults assumed");
  result.recorded_config = to_string(settings.recorded);
  settings.replayed =
      options.config ? *options.config : parse_config(settings_with(result.recorded_config, options.set));
  result.replayed_config = to_string(settings.replayed);
  return settings;
}

// The simulated device: the recorded device's total, else an H200's, or the
// capacity asked for when that is larger (a B200).
SimulatedDeviceOptions simulated_device_of(const snapshot::Snapshot& head, const AllocatorReplayOptions& options,
                                           ReplayResult& result) {
  SimulatedDeviceOptions device_options = simulated_h200_options();
  for (const auto& info : head.devices) {
    if (info.index == result.device && info.total_bytes != 0) {
      device_options.capacity = info.total_bytes;
      result.device_total_known = true;
    }
  }
  if (!result.device_total_known) {
    // PyTorch's snapshots hold no device total. The note says what the
    // replay used: an H200, or the device the --capacity asked for.
    const std::string why = "the snapshot holds no device total (PyTorch's snapshots record none): the simulated device has ";
    if (options.capacity && *options.capacity > device_options.capacity) {
      device_options.capacity = *options.capacity;
      result.notes.push_back(why + std::to_string(device_options.capacity) +
                             " bytes, the --capacity given (larger than an H200's)");
    } else if (options.capacity) {
      result.notes.push_back(why + std::to_string(device_options.capacity) + " bytes, an H200's, capped at the " +
                             std::to_string(*options.capacity) + " bytes of --capacity");
    } else {
      result.notes.push_back(why + std::to_string(device_options.capacity) +
                             " bytes, an H200's; a run on a smaller GPU runs out sooner: give its size with --capacity");
    }
  }
  result.device_total = device_options.capacity;
  return device_options;
}

// The cap asked for, as the allocator's memory fraction (0: none). Throws
// InvalidArgument for a fraction, capacity or request scale out of range.
double asked_fraction(const AllocatorReplayOptions& options, const ReplayResult& result) {
  if (options.fraction && options.capacity) throw InvalidArgument("--fraction and --capacity exclude each other");
  double fraction = 0;
  if (options.fraction) {
    if (!(*options.fraction > 0 && *options.fraction <= 1)) throw InvalidArgument("the fraction must be within (0, 1]");
    fraction = *options.fraction;
  } else if (options.capacity) {
    // Without a recorded total the simulated device grows to the capacity
    // (a larger GPU); a recorded device holds no more than its total.
    if (*options.capacity == 0 && !result.device_total_known)
      throw InvalidArgument("the capacity must be at least 1 byte");
    if (*options.capacity == 0 || *options.capacity > result.device_total)
      throw InvalidArgument("the capacity must be between 1 byte and the recorded device total, " +
                            std::to_string(result.device_total) + " bytes");
  }
  if (options.capacity) fraction = fraction_for_cap(*options.capacity, result.device_total);
  if (!(options.scale > 0 && options.scale <= 1024))
    throw InvalidArgument("the request scale must be within (0, 1024]");
  return fraction;
}

// The layout at the ring's start, its impossible fragments joined. Throws
// InvalidArgument for a start the replay cannot rebuild.
InitialLayout start_layout(EventSource& source, ReplayResult& result) {
  InitialLayout initial = initial_layout(source, result.device);
  result.joined_fragments = initial.joined_fragments;
  if (result.joined_fragments != 0)
    result.notes.push_back(std::to_string(result.joined_fragments) +
                           " free fragments of at most 1 MiB in large-pool segments at the ring's start (which the "
                           "allocator never leaves: it does not split off so little) joined to the block before each, "
                           "whose size the trace gave only as its request");
  result.starts_mid_run = !initial.segments.empty();
  result.initial_segments = initial.segments.size();
  for (const auto& segment : initial.segments)
    if (segment.expandable)
      throw InvalidArgument("the trace begins mid-run with expandable segments, which the replay cannot rebuild");
  return initial;
}

// The first pass, under the recorded settings and the recorded cap as far
// as the options tell it: --recorded-fraction, else the replay's own cap
// (`asked`, from --fraction or --capacity alike).
RecordedPass read_recorded_run(EventSource& source, const AllocatorReplayOptions& options, const InitialLayout& initial,
                               const AllocatorConfig& recorded, double asked, const ReplayResult& result) {
  const double recorded_fraction = options.recorded_fraction.value_or(asked);
  const std::uint64_t cap_hint =
      static_cast<std::uint64_t>(recorded_fraction * static_cast<double>(result.device_total));
  return recorded_pass(source, result.device, initial, recorded, cap_hint,
                       source.head().header.source == "pytorch-pickle", result.device_total);
}

// What the first pass found, into `result`. Returns the replay's fraction:
// `asked`, else the recorded cap when the recording shows one (its own
// settings include its cap).
double take_recorded_run(const RecordedPass& pass, const AllocatorReplayOptions& options, double asked,
                         ReplayResult& result) {
  result.recorded = pass.figures;
  result.recorded_cap = pass.first_oom_cap;
  double fraction = asked;
  if (!options.fraction && !options.capacity && options.recorded_fraction && *options.recorded_fraction > 0) {
    fraction = *options.recorded_fraction;
    result.notes.push_back("the recorded fraction (--recorded-fraction) caps the replay too; --fraction or "
                           "--capacity gives it another cap");
  } else if (!options.fraction && !options.capacity && pass.oom_cap != 0) {
    fraction = fraction_for_cap(pass.oom_cap, result.device_total);
    result.notes.push_back("the recorded cap (" + std::to_string(pass.oom_cap) + " bytes, from its OOM) applies");
  }
  result.cap = fraction == 0 ? 0 : static_cast<std::uint64_t>(fraction * static_cast<double>(result.device_total));
  result.inferred_empty_cache = pass.empty_cache.size();
  result.deferred_frees = pass.deferred.size();
  for (const std::uint32_t queue : pass.deferred_queue)
    result.deferred_queues = std::max<std::uint64_t>(result.deferred_queues, queue + 1);
  result.inferred_private_pools = pass.private_pools;
  result.private_pool_requests = pass.pool_routes.size();
  if (pass.private_pools != 0)
    result.notes.push_back(std::to_string(pass.private_pools) +
                           (pass.private_pools == 1 ? " private memory pool" : " private memory pools") +
                           " inferred (CUDA graph captures or MemPools: segments reserved while a default-pool "
                           "block on the stream fitted), " +
                           std::to_string(pass.pool_routes.size()) + " requests replayed in them");
  return fraction;
}

}  // namespace

ReplayResult replay_allocator(EventSource& source, const AllocatorReplayOptions& options) {
  const snapshot::Snapshot& head = source.head();
  ReplayResult result = start_result(source, options);
  ReplayPlan plan;
  plan.device = result.device;
  const Settings settings = settings_of(head, options, result);
  plan.config = settings.replayed;
  plan.device_options = simulated_device_of(head, options, result);
  const double asked = asked_fraction(options, result);
  plan.initial = start_layout(source, result);
  plan.pass = read_recorded_run(source, options, plan.initial, settings.recorded, asked, result);
  plan.fraction = take_recorded_run(plan.pass, options, asked, result);
  replay_requests(source, options, plan, result);
  if (result.replayed_peak_at_request && result.replayed.peak_reserved_event != result.recorded.peak_reserved_event)
    result.notes.push_back("the replay reached its peak reserved serving request #" +
                           std::to_string(result.replayed.peak_reserved_event) +
                           ", for which the recording reserved nothing: the replayed peak names that request, the "
                           "recorded one its reservation");
  if (result.initial_blocks_not_rebuilt != 0)
    result.notes.push_back(std::to_string(result.initial_blocks_not_rebuilt) +
                           " segments of the ring's start could not be laid out block for block as recorded");
  return result;
}

}  // namespace cachealloc::analyzer
