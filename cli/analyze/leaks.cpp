#include <memory>

#include "command.hpp"

namespace cachealloc::cli {

void add_leaks_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand("leaks", "Allocations still live at the end, with their sites");
  add_common_options(*command, runner.common);
  auto min_size = std::make_shared<std::string>("0");
  auto limit = std::make_shared<std::size_t>(0);
  command->add_option("--min-size", *min_size, "list only allocations of at least N bytes (suffixes K, M, G)");
  command->add_option("--limit", *limit, "list at most N sites and N allocations (0: all)")
      ->check(whole_number(0, 1'000'000'000'000));
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze leaks run.bin --min-size 1M\n"
      "  cachealloc-analyze leaks run.bin --to 12000 --format json");
  command->callback([&runner, min_size, limit] {
    runner.select("leaks", ReportJob{[min_size, limit](analyzer::EventSource& source,
                                                       analyzer::ReportOptions& options) {
      options.min_size = byte_count(*min_size, "--min-size");
      options.limit = *limit;
      return analyzer::leaks_report(source, options);
    }});
  });
}

}  // namespace cachealloc::cli
