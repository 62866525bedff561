#include <memory>

#include "cachealloc/analyzer/html_report.hpp"
#include "command.hpp"

namespace cachealloc::cli {

void add_html_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand(
      "html", "One self-contained offline HTML report: timeline, segment map, sites, fragmentation, summary");
  add_common_options(*command, runner.common);
  // The output is a page, never a table; the page covers the whole trace.
  command->remove_option(command->get_option("--format"));
  command->remove_option(command->get_option("--table"));
  auto exact = std::make_shared<std::size_t>(analyzer::HtmlOptions{}.exact_events);
  command->add_option("--exact-events", *exact,
                      "zoom windows holding fewer events than this are drawn event by event")
      ->check(whole_number(100, 1'000'000))
      ->capture_default_str();
  auto detail = std::make_shared<std::size_t>(analyzer::HtmlOptions{}.detail_events);
  command->add_option("--detail-events", *detail,
                      "events the page keeps event by event; a longer trace keeps them only around its peaks, "
                      "first OOMs and last events (bounds the page's size)")
      ->check(whole_number(1000, 1'000'000'000))
      ->capture_default_str();
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze html run.bin -o report.html\n"
      "  cachealloc-analyze html torch_snapshot.pickle -o report.html");
  command->callback([&runner, exact, detail, command] {
    whole_trace_only(*command, "the report covers the whole trace; select a window in the page (drag on the timeline)");
    runner.select("html", WriterJob{[exact, detail](analyzer::EventSource& source, analyzer::ReportOptions& options,
                                            std::ostream& out) {
      analyzer::HtmlOptions html;
      html.exact_events = *exact;
      html.detail_events = *detail;
      analyzer::write_html_report(source, options, html, out);
    }});
  });
}

}  // namespace cachealloc::cli
