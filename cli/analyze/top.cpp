#include <limits>
#include <memory>

#include "command.hpp"

namespace cachealloc::cli {

void add_top_command(CLI::App& app, Runner& runner) {
  CLI::App* command =
      app.add_subcommand("top", "Allocation sites by bytes, by count and by contribution to the peak");
  add_common_options(*command, runner.common);
  auto by = std::make_shared<std::string>("bytes");
  auto limit = std::make_shared<std::size_t>(20);
  command->add_option("--by", *by, "order")->check(one_of({"bytes", "count", "peak"}))->capture_default_str();
  command->add_option("--limit", *limit, "list at most N sites (0: all)")
      ->check(whole_number(0, 1'000'000'000'000))
      ->capture_default_str();
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze top run.bin\n"
      "  cachealloc-analyze top run.bin --by peak --limit 5");
  command->callback([&runner, by, limit] {
    runner.select("top", ReportJob{[by, limit](analyzer::EventSource& source, analyzer::ReportOptions& options) {
      options.order = *by == "count"  ? analyzer::ReportOptions::SiteOrder::count
                      : *by == "peak" ? analyzer::ReportOptions::SiteOrder::peak
                                      : analyzer::ReportOptions::SiteOrder::bytes;
      options.limit = *limit == 0 ? std::numeric_limits<std::size_t>::max() : *limit;
      return analyzer::top_report(source, options);
    }});
  });
}

}  // namespace cachealloc::cli
