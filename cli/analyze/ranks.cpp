#include <unistd.h>

#include <cstdio>
#include <memory>
#include <stdexcept>

#include "cachealloc/analyzer/compare.hpp"
#include "cachealloc/snapshot/text.hpp"
#include "command.hpp"

namespace cachealloc::cli {

namespace {

struct RanksArguments {
  unsigned threads = 0;
  std::size_t limit = 10;
};

}  // namespace

void add_ranks_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand(
      "ranks", "One table over N snapshots, one per rank or device: peaks, headroom, imbalance, the rank closest to "
               "OOM, the sites that differ most");
  // Each file's own decoders are off by default (the files keep the cores
  // busy): the help shows 0, the other subcommands keep theirs.
  const unsigned decode_default = runner.common.decode_threads;
  runner.common.decode_threads = 0;
  add_files_options(*command, runner.common, "FILE... | DIR: the snapshots, or folders of them", true);
  runner.common.decode_threads = decode_default;
  command->get_option("--device")->description("device index in every file (default: every device of each file)");
  auto args = std::make_shared<RanksArguments>();
  command->add_option("--threads", args->threads, "files analyzed at once (0: one per CPU this process may run on)")
      ->check(whole_number(0, 4096))
      ->capture_default_str();
  command->add_option("--limit", args->limit, "list at most N sites that differ between ranks (0: all)")
      ->check(whole_number(0, 1'000'000'000'000))
      ->capture_default_str();
  command->footer(
      "Ranks are ordered by file name, naturally (rank_2 before rank_10); the rank is the number after\n"
      "rank, gpu, device or cuda in the name, else its only number.\n"
      "Examples:\n"
      "  cachealloc-analyze ranks snapshots/\n"
      "  cachealloc-analyze ranks rank_*.pickle --threads 8\n"
      "  cachealloc-analyze ranks snapshots/ --format jsonl -o ranks.jsonl   # one JSON line per rank\n"
      "A file holding several devices gives one row per device (--device N: only device N of each file).\n"
      "A file that cannot be read is skipped with one line on stderr and a row marked unreadable, its figures\n"
      "unknown; the exit status is 0 while at least one file was read, 2 when none could be.");
  command->callback([&runner, args, command] {
    if (command->get_option("--decode-threads")->count() == 0) runner.common.decode_threads = 0;
    runner.select("ranks", FilesJob{[args, &runner](const std::vector<std::string>& arguments,
                                                    analyzer::ReportOptions& options, bool jsonl,
                                                    std::ostream& out) -> std::optional<analyzer::Document> {
      analyzer::RanksOptions ranks;
      ranks.summary = {options.sites, options.device, false};
      ranks.threads = args->threads;
      ranks.decode_threads = runner.common.decode_threads;
      ranks.site_limit = args->limit;
      if (isatty(STDERR_FILENO)) {
        ranks.progress = [](std::size_t done, std::size_t total) {
          std::fprintf(stderr, "\rranks: %zu/%zu files", done, total);
          if (done == total) std::fprintf(stderr, "\r\033[K");
          std::fflush(stderr);
        };
      }
      std::vector<analyzer::RankSummary> summaries;
      try {
        for (const std::string& a : arguments)
          if (a == "-") throw std::invalid_argument("ranks: standard input is not one of the files (name them)");
        summaries = analyzer::summarize_ranks(analyzer::rank_files(arguments), ranks);
      } catch (const std::invalid_argument& error) {
        throw UsageError(error.what());
      }
      // An unreadable file: one line here, a marked row in the output; the
      // run fails only when no file could be read.
      std::size_t unreadable = 0;
      for (const analyzer::RankSummary& summary : summaries) unreadable += summary.readable() ? 0 : 1;
      // None readable: one line, the first file's reason (and how many more failed).
      if (unreadable == summaries.size() && !summaries.empty()) {
        std::string line = summaries.front().error;
        if (summaries.size() > 1)
          line += " (and the other " + std::to_string(summaries.size() - 1) + " file(s) could not be read either)";
        throw UsageError(line);
      }
      for (const analyzer::RankSummary& summary : summaries)
        if (!summary.readable())
          std::fprintf(stderr, "%s: ranks: skipped: %s\n", kProgram, snapshot::printable(summary.error).c_str());
      if (jsonl) {
        analyzer::write_ranks_jsonl(summaries, ranks, out);
        return std::nullopt;
      }
      return analyzer::ranks_report(summaries, ranks);
    }});
  });
}

}  // namespace cachealloc::cli
