#include <limits>
#include <memory>

#include "command.hpp"

namespace cachealloc::cli {

void add_peak_command(CLI::App& app, Runner& runner) {
  CLI::App* command =
      app.add_subcommand("peak", "The moment of the peak and every allocation live then, grouped by site");
  add_common_options(*command, runner.common);
  auto metric = std::make_shared<std::string>("allocated");
  auto limit = std::make_shared<std::size_t>(20);
  auto all = std::make_shared<bool>(false);
  command->add_option("--metric", *metric, "which peak: allocated or reserved")
      ->check(one_of({"allocated", "reserved"}))
      ->capture_default_str();
  CLI::Option* limit_option =
      command->add_option("--limit", *limit, "list the N largest sites and allocations, the rest in one row (0: all)")
          ->check(whole_number(0, 1'000'000'000'000))
          ->capture_default_str();
  command->add_flag("--all", *all, "list every site and every live allocation")->excludes(limit_option);
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze peak run.bin\n"
      "  cachealloc-analyze peak run.bin --metric reserved --limit 10\n"
      "  cachealloc-analyze peak run.bin --all --format csv --table allocations");
  command->callback([&runner, metric, limit, all] {
    runner.select("peak", ReportJob{[metric, limit, all](analyzer::EventSource& source,
                                                         analyzer::ReportOptions& options) {
      options.peak_reserved = *metric == "reserved";
      options.limit = *all || *limit == 0 ? std::numeric_limits<std::size_t>::max() : *limit;
      return analyzer::peak_report(source, options);
    }});
  });
}

}  // namespace cachealloc::cli
