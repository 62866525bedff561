#include <memory>

#include "command.hpp"

namespace cachealloc::cli {

void add_segments_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand("segments", "Every segment's layout: a page map, then each block");
  add_common_options(*command, runner.common);
  auto at = std::make_shared<std::string>();
  auto at_time = std::make_shared<std::string>();
  CLI::Option* at_option = command->add_option("--at", *at, "the state just after this event index (default: the end)");
  command->add_option("--at-time", *at_time, "the state at this time since the first event (1.5s, 200ms)")
      ->excludes(at_option);
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze segments run.bin\n"
      "  cachealloc-analyze segments run.bin --at 1200\n"
      "  cachealloc-analyze segments run.bin --at-time 2.5s --format csv -o blocks.csv");
  command->callback([&runner, at, at_time] {
    runner.select("segments", ReportJob{[at, at_time](analyzer::EventSource& source, analyzer::ReportOptions& options) {
      if (!at->empty()) {
        // The state after that event (a free no stream waited on settles
        // with its completion, as every report's --at and --to).
        const std::size_t end = state_end(source, *at, "--at");
        options.at = end == 0 ? analyzer::kNoEvent : end - 1;
      }
      if (!at_time->empty()) {
        // The state after every event at or before that time.
        const std::size_t end = state_end(source, *at_time + (at_time->back() == 's' ? "" : "s"), "--at-time");
        options.at = end == 0 ? analyzer::kNoEvent : end - 1;
      }
      if (options.at && *options.at != analyzer::kNoEvent && *options.at < options.window.begin)
        throw UsageError("--at " + (at->empty() ? *at_time : *at) + " (event #" + std::to_string(*options.at) +
                         ") is before --from (event #" + std::to_string(options.window.begin) + ")");
      if (options.at == analyzer::kNoEvent) options.at = std::nullopt, options.window.end = 0;
      return analyzer::segments_report(source, options);
    }});
  });
}

}  // namespace cachealloc::cli
