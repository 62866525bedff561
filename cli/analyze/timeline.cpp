#include <memory>

#include "command.hpp"

namespace cachealloc::cli {

void add_timeline_command(CLI::App& app, Runner& runner) {
  CLI::App* command =
      app.add_subcommand("timeline", "Allocated, reserved, active and requested over time, with the peaks marked");
  add_common_options(*command, runner.common);
  add_follow_options(*command, runner.common);
  auto buckets = std::make_shared<std::size_t>(100);
  auto all_events = std::make_shared<bool>(false);
  CLI::Option* buckets_option =
      command->add_option("--buckets", *buckets, "N slices, each with its largest values")
          ->check(whole_number(1, 10'000'000))
          ->capture_default_str();
  command->add_flag("--all-events", *all_events, "one row per event instead of slices, written as they are replayed (bounded memory)")->excludes(buckets_option);
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze timeline run.bin --buckets 50\n"
      "  cachealloc-analyze timeline run.bin --all-events --format csv -o timeline.csv");
  command->callback([&runner, buckets, all_events] {
    runner.select("timeline", ReportJob{[buckets, all_events](analyzer::EventSource& source,
                                                              analyzer::ReportOptions& options) {
      options.buckets = *all_events ? 0 : *buckets;
      options.stream_rows = *all_events;
      return analyzer::timeline_report(source, options);
    }});
  });
}

}  // namespace cachealloc::cli
