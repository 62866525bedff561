#include <memory>

#include "command.hpp"

namespace cachealloc::cli {

void add_export_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand("export", "Write one table as RFC 4180 CSV with a header row");
  add_common_options(*command, runner.common);
  // CSV is export's default; --help shows it.
  command->get_option("--format")->default_str("csv");
  auto what = std::make_shared<std::string>();
  auto buckets = std::make_shared<std::size_t>(0);
  command->add_option("--what", *what, "timeline, events, segments (one row per block) or sites")
      ->check(one_of({"timeline", "events", "segments", "sites"}))
      ->required();
  command->add_option("--buckets", *buckets, "timeline: N slices instead of one row per event (0: every event)")
      ->check(whole_number(0, 10'000'000))
      ->capture_default_str();
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze export run.bin --what timeline -o timeline.csv\n"
      "  cachealloc-analyze export run.bin --what sites -o sites.csv");
  command->callback([&runner, what, buckets, command] {
    // CSV unless --format was given explicitly.
    if (command->get_option("--format")->count() == 0) runner.common.format = "csv";
    runner.select("export", [what, buckets](analyzer::EventSource& source, analyzer::ReportOptions& options) {
      options.buckets = *buckets;
      return analyzer::export_report(source, *analyzer::parse_export_table(*what), options);
    });
  });
}

}  // namespace cachealloc::cli
