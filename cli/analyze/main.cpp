// cachealloc-analyze: answers about a memory-history snapshot.
// Exit codes: 0 the input was read and the report written; 2 bad usage or
// unreadable input (one line on stderr); 1 an internal error.
#include <cstdio>
#include <exception>

#include "cachealloc/snapshot/format.hpp"
#include "command.hpp"

int main(int argc, char** argv) {
  using namespace cachealloc::cli;
  CLI::App app("Analyze a cachealloc memory-history snapshot. Without a subcommand, prints the summary.",
               "cachealloc-analyze");
  Runner runner;
  add_common_options(app, runner.common, /*file_required=*/false);
  add_summary_command(app, runner);
  add_segments_command(app, runner);
  add_fragmentation_command(app, runner);
  add_timeline_command(app, runner);
  add_peak_command(app, runner);
  add_top_command(app, runner);
  add_leaks_command(app, runner);
  add_oom_command(app, runner);
  add_events_command(app, runner);
  add_export_command(app, runner);
  add_convert_command(app, runner);
  app.require_subcommand(0, 1);
  app.footer(
      "Examples:\n"
      "  cachealloc-analyze run.bin                       # summary\n"
      "  cachealloc-analyze peak run.bin                  # who held the memory at the peak\n"
      "  cachealloc-analyze oom run.bin                   # why it ran out of memory\n"
      "  cachealloc-analyze timeline run.bin --buckets 100 --format csv -o timeline.csv\n"
      "  cachealloc-analyze convert run.bin -o run.pickle  # for PyTorch's _memory_viz\n"
      "Every subcommand takes --format table|csv|json, -o FILE, --from/--to EVENT|TIME and --device N.");
  try {
    app.parse(argc, argv);
    if (!runner.selected()) {
      if (runner.common.file.empty()) throw CLI::RequiredError("FILE");
      runner.select("summary", [](cachealloc::analyzer::EventSource& source, cachealloc::analyzer::ReportOptions& options) {
        return cachealloc::analyzer::summary_report(source, options);
      });
    }
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "cachealloc-analyze: error: %s (see --help)\n", e.what());
    return 2;
  }
  try {
    runner.run();
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "cachealloc-analyze: error: %s\n", e.what());
    return 2;
  } catch (const cachealloc::snapshot::SnapshotError& e) {
    std::fprintf(stderr, "cachealloc-analyze: error: cannot read %s: %s\n", runner.common.file.c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cachealloc-analyze: internal error: %s\n", e.what());
    return 1;
  }
}
