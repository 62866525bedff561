#include <memory>

#include "command.hpp"

namespace cachealloc::cli {

void add_fragmentation_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand(
      "fragmentation",
      "External fragmentation, rounding waste, split and cached free bytes: overall, per segment, over time");
  add_common_options(*command, runner.common);
  auto buckets = std::make_shared<std::size_t>(20);
  command->add_option("--buckets", *buckets, "slices of the trace for the figures over time")
      ->check(whole_number(1, 100000))
      ->capture_default_str();
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze fragmentation run.bin\n"
      "  cachealloc-analyze fragmentation run.bin --buckets 200 --format csv --table over_time -o frag.csv");
  command->callback([&runner, buckets] {
    runner.select("fragmentation", ReportJob{[buckets](analyzer::EventSource& source,
                                                       analyzer::ReportOptions& options) {
      options.buckets = *buckets;
      return analyzer::fragmentation_report(source, options);
    }});
  });
}

}  // namespace cachealloc::cli
