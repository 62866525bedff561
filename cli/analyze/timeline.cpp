#include <memory>

#include "command.hpp"

namespace cachealloc::cli {

void add_timeline_command(CLI::App& app, Runner& runner) {
  CLI::App* command =
      app.add_subcommand("timeline", "Allocated, reserved, active and requested over time, with the peaks marked");
  add_common_options(*command, runner.common);
  auto buckets = std::make_shared<std::size_t>(0);
  command->add_option("--buckets", *buckets, "N slices, each with its largest values (default: one row per event)");
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze timeline run.bin --buckets 50\n"
      "  cachealloc-analyze timeline run.bin --format csv -o timeline.csv");
  command->callback([&runner, buckets] {
    runner.select("timeline", [buckets](analyzer::EventSource& source, analyzer::ReportOptions& options) {
      options.buckets = *buckets;
      return analyzer::timeline_report(source, options);
    });
  });
}

}  // namespace cachealloc::cli
