#include <memory>

#include "command.hpp"

namespace cachealloc::cli {

void add_flamegraph_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand(
      "flamegraph", "The bytes live at one moment by stack: an interactive SVG, or collapsed stacks");
  add_common_options(*command, runner.common);
  // The output is an SVG or collapsed text, never a table.
  command->remove_option(command->get_option("--format"));
  command->remove_option(command->get_option("--table"));
  auto at = std::make_shared<std::string>("peak");
  auto metric = std::make_shared<std::string>("allocated");
  auto collapsed = std::make_shared<bool>(false);
  command->add_option("--at", *at, "the moment: peak (of the metric), end, an event index or a time (1.5s)")
      ->capture_default_str();
  command->add_option("--metric", *metric, "allocated, requested or reserved (segments, by their allocation stack)")
      ->check(one_of({"allocated", "requested", "reserved"}))
      ->capture_default_str();
  command->add_flag("--collapsed", *collapsed,
                    "write collapsed stacks ('root;...;frame bytes' lines, for flamegraph.pl and speedscope)");
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze flamegraph run.bin -o peak.svg\n"
      "  cachealloc-analyze flamegraph torch.pickle --metric reserved --at end -o reserved.svg\n"
      "  cachealloc-analyze flamegraph run.bin --at 1.5s --collapsed | flamegraph.pl > live.svg");
  command->callback([&runner, at, metric, collapsed] {
    runner.select("flamegraph", WriterJob{[at, metric, collapsed](analyzer::EventSource& source,
                                                                  analyzer::ReportOptions& options, std::ostream& out) {
      analyzer::FlameOptions flame;
      flame.metric = *metric == "requested"  ? analyzer::FlameMetric::requested
                     : *metric == "reserved" ? analyzer::FlameMetric::reserved
                                             : analyzer::FlameMetric::allocated;
      if (*at == "peak") {
        flame.at = analyzer::FlameOptions::At::peak;
      } else if (*at == "end") {
        flame.at = analyzer::FlameOptions::At::end;
      } else {
        flame.at = analyzer::FlameOptions::At::event;
        // The state after every event up to that index, or at or before that time.
        const std::size_t end = state_end(source, *at, "--at");
        if (end == 0) throw UsageError("--at " + *at + " is before the first event; or use peak or end");
        flame.event = end - 1;
      }
      const analyzer::FlameGraph graph = analyzer::flame_graph(source, options, flame);
      if (*collapsed)
        analyzer::write_collapsed(graph, out);
      else
        analyzer::write_flame_svg(graph, out);
    }});
  });
}

}  // namespace cachealloc::cli
