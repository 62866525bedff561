#include <memory>

#include "cachealloc/analyzer/compare.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "command.hpp"

namespace cachealloc::cli {

namespace {

struct DiffArguments {
  std::string by = "peak";
  std::size_t limit = 20;
};

// The file's summary; a file that is not a readable snapshot is a usage error naming it.
analyzer::RunSummary summary_of(const std::string& file, const analyzer::ReportOptions& options, unsigned decode_threads) {
  try {
    analyzer::FileEvents source(file, decode_threads);
    const snapshot::Snapshot& head = source.head();
    if (options.device >= 0 && !head.devices.empty() &&
        std::none_of(head.devices.begin(), head.devices.end(),
                     [&](const snapshot::DeviceInfo& d) { return d.index == options.device; }))
      throw UsageError("--device " + std::to_string(options.device) + ": device " + std::to_string(options.device) +
                       " is not in " + file);
    analyzer::RunSummary run = analyzer::summarize(source, {options.sites, options.device, true});
    run.file = file == "-" ? "standard input" : file;
    return run;
  } catch (const snapshot::SnapshotError& error) {
    if (error.code() == snapshot::ErrorCode::io) throw UsageError(error.what());  // it names the path
    throw UsageError("cannot read " + (file == "-" ? std::string("standard input") : file) + ": " + error.what());
  }
}

}  // namespace

void add_diff_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand(
      "diff", "What changed from run A to run B: peaks, segments, fragmentation, sites (grown, shrunk, new, gone) and "
              "annotated phases");
  add_files_options(*command, runner.common, "A B: the two snapshots (ours or PyTorch pickles)", false);
  auto args = std::make_shared<DiffArguments>();
  command->add_option("--by", args->by, "what a site's growth measures: bytes live at the allocated peak, bytes "
                                        "allocated over the run, or bytes live at the end")
      ->check(one_of({"peak", "allocated_over_run", "end"}))
      ->capture_default_str();
  command->add_option("--limit", args->limit, "list at most N changed sites (0: all)")
      ->check(whole_number(0, 1'000'000'000'000))
      ->capture_default_str();
  command->footer(
      "Sites are matched by their user frames (--frames N of them), phases by annotation name and occurrence.\n"
      "Examples:\n"
      "  cachealloc-analyze diff before.pickle after.pickle\n"
      "  cachealloc-analyze diff a.bin b.bin --by allocated_over_run --limit 0 --format json\n"
      "  cachealloc-analyze diff a.bin b.bin --format csv --table phases");
  command->callback([&runner, args] {
    runner.select("diff", FilesJob{[args, &runner](const std::vector<std::string>& files,
                                                   analyzer::ReportOptions& options, bool,
                                                   std::ostream&) -> std::optional<analyzer::Document> {
      if (files.size() != 2)
        throw UsageError("diff takes two snapshots, A and B (got " + std::to_string(files.size()) + ")");
      if (files[0] == "-" && files[1] == "-") throw UsageError("diff: only one of A and B can be standard input");
      const analyzer::RunSummary a = summary_of(files[0], options, runner.common.decode_threads);
      const analyzer::RunSummary b = summary_of(files[1], options, runner.common.decode_threads);
      analyzer::DiffOptions diff;
      diff.by = args->by == "allocated_over_run" ? analyzer::DiffOptions::SiteMetric::allocated_over_run
                : args->by == "end"     ? analyzer::DiffOptions::SiteMetric::end
                                        : analyzer::DiffOptions::SiteMetric::peak;
      diff.limit = args->limit;
      return analyzer::diff_report(a, b, diff);
    }});
  });
}

}  // namespace cachealloc::cli
