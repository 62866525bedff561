#include <memory>

#include "command.hpp"

namespace cachealloc::cli {

void add_peak_command(CLI::App& app, Runner& runner) {
  CLI::App* command =
      app.add_subcommand("peak", "The moment of the peak and every allocation live then, grouped by site");
  add_common_options(*command, runner.common);
  auto metric = std::make_shared<std::string>("allocated");
  auto limit = std::make_shared<std::size_t>(0);
  command->add_option("--metric", *metric, "which peak: allocated or reserved")
      ->check(one_of({"allocated", "reserved"}))
      ->capture_default_str();
  command->add_option("--limit", *limit, "list at most N sites and N allocations (0: all)")
      ->check(whole_number(0, 1'000'000'000'000));
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze peak run.bin\n"
      "  cachealloc-analyze peak run.bin --metric reserved --limit 10");
  command->callback([&runner, metric, limit] {
    runner.select("peak", ReportJob{[metric, limit](analyzer::EventSource& source, analyzer::ReportOptions& options) {
      options.peak_reserved = *metric == "reserved";
      options.limit = *limit;
      return analyzer::peak_report(source, options);
    }});
  });
}

}  // namespace cachealloc::cli
