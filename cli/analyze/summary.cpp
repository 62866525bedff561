#include <memory>

#include "command.hpp"

namespace cachealloc::cli {

void add_summary_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand(
      "summary", "Device and allocator totals, the peaks and when they happened, event counts, fragmentation");
  add_common_options(*command, runner.common);
  add_follow_options(*command, runner.common);
  auto at = std::make_shared<std::string>();
  command->add_option("--at", *at, "the state just after this event: an index or a time (the same as --to)")
      ->excludes(command->get_option("--to"));
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze summary run.bin\n"
      "  cachealloc-analyze run.bin --format json        # the same: summary is the default\n"
      "  cachealloc-analyze summary run.bin --at 1200    # the gap after event #1200\n"
      "  cachealloc-analyze summary run.bin --from 2s --to 5s\n"
      "  cachealloc-analyze summary --follow run.bin     # a streamed recording, while it is written\n"
      "--format csv writes the figures as key,value,lower_bound rows; --table peaks writes the peaks table.");
  command->callback([&runner, at] {
    if (!at->empty()) runner.common.to = *at, runner.common.to_option = "--at";
    runner.select("summary", ReportJob{[](analyzer::EventSource& source, analyzer::ReportOptions& options) {
      return analyzer::summary_report(source, options);
    }});
  });
}

}  // namespace cachealloc::cli
