#include <memory>

#include "cachealloc/analyzer/allocator_replay.hpp"
#include "cachealloc/analyzer/sweep.hpp"
#include "cachealloc/errors.hpp"
#include "command.hpp"

namespace cachealloc::cli {

namespace {

struct ReplayArguments {
  std::vector<std::string> set;
  double fraction = 0;
  std::string capacity;
  double recorded_fraction = 0;
  std::string addresses = "recorded";
  bool sweep = false;
  std::vector<std::string> axes;
  unsigned threads = 0;
  bool largest_batch = false;
};

}  // namespace

void add_replay_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand(
      "replay", "Replay the recorded requests through the allocator on the simulated device, under other settings");
  add_common_options(*command, runner.common);
  auto args = std::make_shared<ReplayArguments>();
  command->add_option("--set", args->set, "a CACHEALLOC_CONF setting over the recorded ones, KEY=VALUE (repeatable)");
  command->add_option("--fraction", args->fraction, "cap reserved memory at this fraction of the device total")
      ->check(number_from(0.0, 1.0));
  command->add_option("--capacity", args->capacity, "cap reserved memory at BYTES (suffixes K, M, G, T)")
      ->excludes("--fraction");
  command->add_option("--recorded-fraction", args->recorded_fraction,
                      "the recorded run's memory fraction, which a PyTorch pickle does not store (the replay's cap too, without --fraction or --capacity)")
      ->check(number_from(0.0, 1.0));
  command->add_option("--addresses", args->addresses,
                      "where reservations land: recorded (as in the recording, while the replay reserves the same) "
                      "or model (the driver address model)")
      ->check(one_of({"recorded", "model"}));
  command->add_flag("--sweep", args->sweep,
                    "replay under a grid of settings (expandable_segments, max_split_size_mb, "
                    "roundup_power2_divisions, garbage_collection_threshold under a cap) and rank them");
  command->add_option("--sweep-axis", args->axes,
                      "--sweep: the values of one key instead of the default ones, KEY=V1,V2,... (repeatable)")
      ->needs("--sweep");
  command->add_option("--threads", args->threads, "--sweep: replays at a time (default: every core)")
      ->check(whole_number(1, 1024))
      ->needs("--sweep");
  command->add_flag("--largest-batch", args->largest_batch,
                    "--sweep under a cap: also find each setting's largest factor by which every request can grow "
                    "and still fit (a batch that much larger, if every tensor scales with it), and rank by it")
      ->needs("--sweep");
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze replay run.bin                               # the recorded settings: reproduces the run\n"
      "  cachealloc-analyze replay run.pickle --set expandable_segments=True --capacity 20GiB\n"
      "  cachealloc-analyze replay run.bin --set max_split_size_mb=256 --format json\n"
      "  cachealloc-analyze replay run.pickle --sweep --capacity 20GiB   # rank a grid of settings at that cap\n"
      "  cachealloc-analyze replay run.pickle --sweep --sweep-axis max_split_size_mb=unlimited,128,512 --threads 8");
  command->callback([&runner, args, command] {
    whole_trace_only(*command, "the replay covers the whole trace: every request from the first event to the dump "
                               "(--from and --to select a window in the reports, e.g. summary --at)");
    runner.select("replay", ReportJob{[args](analyzer::EventSource& source, analyzer::ReportOptions& options) {
      analyzer::AllocatorReplayOptions replay;
      replay.device = options.device;
      replay.set = args->set;
      if (args->fraction > 0) replay.fraction = args->fraction;
      if (!args->capacity.empty()) replay.capacity = byte_count(args->capacity, "--capacity");
      if (args->recorded_fraction > 0) replay.recorded_fraction = args->recorded_fraction;
      replay.placement = args->addresses == "model" ? analyzer::Placement::model : analyzer::Placement::recorded;
      try {
        if (args->sweep) {
          analyzer::SweepOptions sweep;
          sweep.device = replay.device;
          sweep.set = replay.set;
          sweep.fraction = replay.fraction;
          sweep.capacity = replay.capacity;
          sweep.recorded_fraction = replay.recorded_fraction;
          sweep.placement = replay.placement;
          sweep.threads = args->threads;
          sweep.largest_scale = args->largest_batch;
          for (const std::string& axis : args->axes) sweep.axes.push_back(analyzer::sweep_axis(axis));
          return analyzer::sweep_report(analyzer::sweep(source, sweep));
        }
        return analyzer::replay_report(source, replay);
      } catch (const cachealloc::Error& error) {
        throw UsageError(error.what());
      }
    }});
  });
}

}  // namespace cachealloc::cli
