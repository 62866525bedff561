#include <memory>

#include "cachealloc/analyzer/sweep.hpp"
#include "cachealloc/errors.hpp"
#include "command.hpp"

namespace cachealloc::cli {

namespace {

struct RecommendArguments {
  std::string capacity;
  double fraction = 0;
  std::vector<std::string> set;
  unsigned threads = 0;
};

}  // namespace

void add_recommend_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand(
      "recommend", "Which allocator setting would have avoided the OOM or saved memory: a verdict with the evidence");
  add_common_options(*command, runner.common);
  auto args = std::make_shared<RecommendArguments>();
  command->add_option("--capacity", args->capacity,
                      "the memory to fit in, BYTES (suffixes K, M, G, T; default: the recorded cap, if any)");
  command->add_option("--fraction", args->fraction, "the memory to fit in, as a fraction of the device total")
      ->check(number_from(0.0, 1.0))
      ->excludes("--capacity");
  command->add_option("--set", args->set, "a setting kept for every candidate, KEY=VALUE (not a swept key; repeatable)");
  command->add_option("--threads", args->threads, "replays at a time (default: every core)")
      ->check(whole_number(1, 1024));
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze recommend run.pickle                    # at the recorded cap, if the run had one\n"
      "  cachealloc-analyze recommend run.bin --capacity 20GiB --format json");
  command->callback([&runner, args, command] {
    whole_trace_only(*command, "the verdict replays the whole trace: every request from the first event to the dump");
    runner.select("recommend", ReportJob{[args](analyzer::EventSource& source, analyzer::ReportOptions& options) {
      analyzer::RecommendOptions recommend;
      recommend.sweep.device = options.device;
      recommend.sweep.set = args->set;
      recommend.sweep.threads = args->threads;
      if (args->fraction > 0) recommend.sweep.fraction = args->fraction;
      if (!args->capacity.empty()) recommend.sweep.capacity = byte_count(args->capacity, "--capacity");
      try {
        return analyzer::recommend_report(source, recommend);
      } catch (const cachealloc::Error& error) {
        throw UsageError(error.what());
      }
    }});
  });
}

}  // namespace cachealloc::cli
