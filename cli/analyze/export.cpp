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
  auto all_events = std::make_shared<bool>(false);
  command->add_option("--what", *what,
                      "timeline, events, segments (one row per block), sites, or perfetto (Chrome trace-event JSON)")
      ->check(one_of({"timeline", "events", "segments", "sites", "perfetto"}))
      ->required();
  command->add_option("--buckets", *buckets,
                      "timeline: N slices instead of one row per event (0: every event); perfetto: at most N "
                      "slices of counter samples, each keeping its largest value (default " +
                          std::to_string(analyzer::kDefaultPerfettoBuckets) + ")")
      ->check(whole_number(0, 10'000'000))
      ->capture_default_str();
  command->add_flag("--all-events", *all_events, "perfetto: a counter sample at every change (no --buckets)");
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze export run.bin --what timeline -o timeline.csv\n"
      "  cachealloc-analyze export run.bin --what sites -o sites.csv\n"
      "  cachealloc-analyze export run.bin --what perfetto -o trace.json   (open in ui.perfetto.dev)\n"
      "--what segments writes one row per block; --table segments writes one row per segment instead.");
  command->callback([&runner, what, buckets, all_events, command] {
    if (*what == "perfetto") {
      if (command->get_option("--format")->count() != 0 || command->get_option("--table")->count() != 0)
        throw UsageError("--what perfetto writes Chrome trace-event JSON; --format and --table do not apply");
      if (*all_events && command->get_option("--buckets")->count() != 0)
        throw UsageError("--all-events and --buckets: choose one (every change, or N slices)");
      const std::size_t slices =
          *all_events ? 0 : command->get_option("--buckets")->count() != 0 ? *buckets : analyzer::kDefaultPerfettoBuckets;
      if (!*all_events && slices == 0) throw UsageError("--buckets 0: for every change use --all-events");
      runner.select("export", WriterJob{[slices](analyzer::EventSource& source, analyzer::ReportOptions& options,
                                                 std::ostream& out) {
        analyzer::write_perfetto_trace(source, options, slices, out);
      }});
      return;
    }
    if (*all_events) throw UsageError("--all-events: only with --what perfetto");
    // CSV unless --format was given explicitly.
    if (command->get_option("--format")->count() == 0) runner.common.format = "csv";
    runner.select("export", ReportJob{[what, buckets](analyzer::EventSource& source, analyzer::ReportOptions& options) {
      options.buckets = *buckets;
      // One row per event: rows are made while the table is written, so
      // memory stays one row whatever the trace's length.
      options.stream_rows = *buckets == 0;
      return analyzer::export_report(source, *analyzer::parse_export_table(*what), options);
    }});
  });
}

}  // namespace cachealloc::cli
