#include <memory>
#include <vector>

#include "command.hpp"

namespace cachealloc::cli {

void add_events_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand(
      "events", "The events, filtered by kind and range: counted in slices, or every one with --all-events");
  add_common_options(*command, runner.common);
  auto kinds = std::make_shared<std::vector<std::string>>();
  auto limit = std::make_shared<std::size_t>(0);
  auto buckets = std::make_shared<std::size_t>(100);
  auto all_events = std::make_shared<bool>(false);
  command->add_option("--kind", *kinds, "only these kinds (repeat or separate with commas): alloc, free_requested, ...")
      ->delimiter(',')
      ->expected(1)
      ->take_all();
  CLI::Option* buckets_option = command->add_option("--buckets", *buckets, "N slices, each with its counts")
                                    ->check(whole_number(1, 10'000'000))
                                    ->capture_default_str();
  CLI::Option* all_option =
      command->add_flag("--all-events", *all_events, "list every event, written as it is read (bounded memory)")
          ->excludes(buckets_option);
  command->add_option("--limit", *limit, "--all-events: list at most N events (0: all)")
      ->check(whole_number(0, 1'000'000'000'000))
      ->needs(all_option);
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze events run.bin --kind oom --all-events\n"
      "  cachealloc-analyze events run.bin --kind segment_alloc,segment_release --from 1s --to 2s\n"
      "  cachealloc-analyze events run.bin --all-events --format csv -o events.csv");
  command->callback([&runner, kinds, limit, buckets, all_events] {
    runner.select("events", ReportJob{[kinds, limit, buckets, all_events](analyzer::EventSource& source,
                                                                          analyzer::ReportOptions& options) {
      for (const std::string& name : *kinds) {
        snapshot::EventKind kind;
        if (!snapshot::parse_event_kind(name, kind)) {
          std::vector<std::string> names;
          for (int k = 0; k < snapshot::kEventKindCount; ++k) names.emplace_back(snapshot::to_string(static_cast<snapshot::EventKind>(k)));
          std::string list;
          for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
          const std::string hint = did_you_mean(name, names);
          throw UsageError("--kind: no event kind is named '" + name + "'" +
                           (hint.empty() ? " (kinds: " + list + ")" : hint));
        }
        options.kinds.push_back(kind);
      }
      options.limit = *limit;
      options.buckets = *all_events ? 0 : *buckets;
      options.stream_rows = *all_events;
      return analyzer::events_report(source, options);
    }});
  });
}

}  // namespace cachealloc::cli
