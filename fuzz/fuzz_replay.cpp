// libFuzzer target: the what-if replay (replay) and the setting sweep
// (replay --sweep) on whatever load() accepts. The input's last byte picks
// the options: a cap or none, a --set pair, the driver address model, and a
// sweep's cap and --largest-batch. The sweep runs a grid of 4 points (8 with
// garbage collection under a cap) on the calling thread. Each report is
// rendered in every format. A refusal must be a SnapshotError or a
// cachealloc::Error (ConfigError, InvalidArgument) of one line, as the CLI
// prints it; anything else escaping is a finding (libFuzzer reports it).
#include <cstddef>
#include <cstdint>

#include "cachealloc/analyzer/allocator_replay.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/sweep.hpp"
#include "cachealloc/errors.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace cachealloc;

void replay(const snapshot::Snapshot& snapshot, unsigned bits) {
  analyzer::SnapshotEvents source(snapshot);
  analyzer::AllocatorReplayOptions options;
  if (bits & 1u) options.capacity = std::uint64_t{64} << 20;
  if (bits & 2u) options.set.push_back("expandable_segments=True");
  if (bits & 4u) options.set.push_back("max_split_size_mb=20");
  if (bits & 8u) options.placement = analyzer::Placement::model;
  try {
    fuzz::render_all(analyzer::replay_report(source, options));
  } catch (const snapshot::SnapshotError& error) {
    fuzz::check_message(error.what());
  } catch (const Error& error) {
    fuzz::check_message(error.what());
  }
}

void sweep(const snapshot::Snapshot& snapshot, unsigned bits) {
  analyzer::SnapshotEvents source(snapshot);
  analyzer::SweepOptions options;
  options.threads = 1;
  const bool capped = (bits & 16u) != 0;
  if (capped) options.capacity = std::uint64_t{32} << 20;
  options.largest_scale = capped && (bits & 32u) != 0;
  options.axes = {analyzer::sweep_axis("expandable_segments=False,True"),
                  analyzer::sweep_axis("max_split_size_mb=unlimited"),
                  analyzer::sweep_axis("roundup_power2_divisions=0,4"),
                  analyzer::sweep_axis(capped ? "garbage_collection_threshold=off,0.8"
                                              : "garbage_collection_threshold=off")};
  try {
    fuzz::render_all(analyzer::sweep_report(analyzer::sweep(source, options)));
  } catch (const snapshot::SnapshotError& error) {
    fuzz::check_message(error.what());
  } catch (const Error& error) {
    fuzz::check_message(error.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::optional<snapshot::Snapshot> snapshot = fuzz::load_small(fuzz::as_bytes(data, size));
  if (!snapshot) return 0;
  const unsigned bits = fuzz::option_bits(data, size);
  replay(*snapshot, bits);
  sweep(*snapshot, bits);
  return 0;
}
