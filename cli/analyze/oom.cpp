#include "cachealloc/analyzer/sweep.hpp"
#include "command.hpp"

namespace cachealloc::cli {

void add_oom_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand(
      "oom", "Each out-of-memory event: the figures, whether empty_cache would have helped, a verdict, the holders, "
      "and the allocator setting that would have avoided it (replayed at the recorded cap)");
  add_common_options(*command, runner.common);
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze oom run.bin\n"
      "  cachealloc-analyze oom run.bin --format json");
  command->callback([&runner] {
    runner.select("oom", ReportJob{[](analyzer::EventSource& source, analyzer::ReportOptions& options) {
      return analyzer::oom_report_with_recommendation(source, options);
    }});
  });
}

}  // namespace cachealloc::cli
