#include <memory>
#include <vector>

#include "command.hpp"

namespace cachealloc::cli {

void add_events_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand("events", "The events, filtered by kind and range");
  add_common_options(*command, runner.common);
  auto kinds = std::make_shared<std::vector<std::string>>();
  auto limit = std::make_shared<std::size_t>(0);
  command->add_option("--kind", *kinds, "only these kinds (repeat or separate with commas): alloc, free_requested, ...")
      ->delimiter(',');
  command->add_option("--limit", *limit, "list at most N events (0: all)");
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze events run.bin --kind oom\n"
      "  cachealloc-analyze events run.bin --kind segment_alloc,segment_release --from 1s --to 2s");
  command->callback([&runner, kinds, limit] {
    runner.select("events", [kinds, limit](analyzer::EventSource& source, analyzer::ReportOptions& options) {
      for (const std::string& name : *kinds) {
        snapshot::EventKind kind;
        if (!snapshot::parse_event_kind(name, kind)) throw UsageError("--kind: no event kind is named '" + name + "'");
        options.kinds.push_back(kind);
      }
      options.limit = *limit;
      return analyzer::events_report(source, options);
    });
  });
}

}  // namespace cachealloc::cli
