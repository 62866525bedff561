#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cachealloc/analyzer/budget.hpp"
#include "command.hpp"

namespace cachealloc::cli {

namespace {

struct CheckArguments {
  std::string peak_reserved, peak_allocated, fragmentation, leaked;
  std::vector<std::string> categories;  // NAME=BYTES, repeatable
  bool accept_lower_bounds = false;
};

// "activation=8GiB".
std::pair<analyzer::Category, std::uint64_t> category_budget(const std::string& text) {
  const auto equals = text.find('=');
  std::string names;
  for (std::size_t c = 0; c < analyzer::kCategoryCount; ++c)
    names += (c == 0 ? "" : ", ") + std::string(analyzer::category_key(static_cast<analyzer::Category>(c)));
  if (equals == std::string::npos)
    throw UsageError("--max-category: '" + text + "' is not CATEGORY=BYTES (e.g. activation=8GiB)");
  const auto category = analyzer::parse_category(text.substr(0, equals));
  if (!category)
    throw UsageError("--max-category: '" + text.substr(0, equals) + "' is no category (" + names + ")");
  return {*category, byte_count(text.substr(equals + 1), "--max-category")};
}

// "30%" or "0.3".
double ratio(const std::string& text) {
  const std::string what = "--max-fragmentation: '" + text + "' is not a share (e.g. 30% or 0.3)";
  std::string number = text;
  const bool percent = !number.empty() && number.back() == '%';
  if (percent) number.pop_back();
  double value = 0;
  try {
    std::size_t used = 0;
    value = std::stod(number, &used);
    if (used != number.size()) throw UsageError(what);
  } catch (const std::exception&) {
    throw UsageError(what);
  }
  if (percent) value /= 100.0;
  if (!(value >= 0 && value <= 1)) throw UsageError("--max-fragmentation: " + text + " is not between 0 and 100%");
  return value;
}

}  // namespace

void add_check_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand(
      "check", "Exit 1 with one line per memory budget the recording exceeds, 0 when it meets them all (for CI)");
  add_common_options(*command, runner.common);
  add_follow_options(*command, runner.common);
  auto args = std::make_shared<CheckArguments>();
  command->add_option("--max-peak-reserved", args->peak_reserved, "budget for the peak of reserved bytes (e.g. 20GiB)");
  command->add_option("--max-peak-allocated", args->peak_allocated, "budget for the peak of allocated bytes");
  command->add_option("--max-fragmentation", args->fragmentation,
                      "budget for the external fragmentation at the reserved peak (e.g. 30% or 0.3)");
  command->add_option("--max-leaked", args->leaked, "budget for the bytes still allocated at the end");
  command->add_option("--max-category", args->categories,
                      "budget for a category's peak, CATEGORY=BYTES (e.g. activation=8GiB; repeatable); categories "
                      "are inferred from frames, annotations and lifetimes")
      ->allow_extra_args(false);
  command->add_flag("--accept-lower-bounds", args->accept_lower_bounds,
                    "treat a budget met by a lower bound as met (a trace that does not cover the whole run)");
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze check run.bin --max-peak-reserved 20GiB\n"
      "  cachealloc-analyze check run.pickle --max-peak-allocated 16GiB --max-fragmentation 30% --max-leaked 0\n"
      "  cachealloc-analyze check run.bin --max-peak-reserved 20GiB --format json   # each budget, its figure, the exit code\n"
      "  cachealloc-analyze check run.pickle --max-category activation=8GiB --max-category optimizer_state=4GiB\n"
      "--format json: {verdict, exit_code, budgets: [{budget, unit, limit, figure, lower_bound, exceeded, unconfirmed}],\n"
      "notes}; --format csv: one row per budget, those columns. An unknown figure is null (JSON) or empty (CSV).\n"
      "Exit status: 0 every budget met; 1 a budget exceeded (one line each on stdout); 2 bad usage or input;\n"
      "3 no budget exceeded, but one is met only by a lower bound: the trace does not cover the whole run\n"
      "(ring overflow, history switched on mid-run) and the file has no recorded peaks. Our recorder's\n"
      "snapshots carry the allocator's peaks, so they always conclude; --accept-lower-bounds turns 3 into 0.");
  auto verdict = runner.verdict;
  command->callback([&runner, args, verdict, command] {
    whole_trace_only(*command, "the budgets hold over the whole trace: its peaks, its fragmentation at the reserved peak "
                               "and what is still allocated at the end");
    const analyzer::Format format = analyzer::parse_format(runner.common.format).value_or(analyzer::Format::table);
    runner.select("check", WriterJob{[args, verdict, format](analyzer::EventSource& source,
                                                     analyzer::ReportOptions& options, std::ostream& out) {
      analyzer::Budgets budgets;
      if (!args->peak_reserved.empty()) budgets.peak_reserved = byte_count(args->peak_reserved, "--max-peak-reserved");
      if (!args->peak_allocated.empty()) budgets.peak_allocated = byte_count(args->peak_allocated, "--max-peak-allocated");
      if (!args->fragmentation.empty()) budgets.fragmentation = ratio(args->fragmentation);
      if (!args->leaked.empty()) budgets.leaked = byte_count(args->leaked, "--max-leaked");
      for (const std::string& text : args->categories) budgets.categories.push_back(category_budget(text));
      if (!budgets.peak_reserved && !budgets.peak_allocated && !budgets.fragmentation && !budgets.leaked &&
          budgets.categories.empty())
        throw UsageError("check: give at least one budget (--max-peak-reserved, --max-peak-allocated, "
                         "--max-fragmentation, --max-leaked, --max-category)");
      budgets.device = options.device;
      const analyzer::BudgetResult result = analyzer::check_budgets(source, budgets);
      *verdict = analyzer::budget_exit_code(result, args->accept_lower_bounds);
      if (format != analyzer::Format::table) {
        analyzer::render(analyzer::budget_document(result, args->accept_lower_bounds), format, out);
        return;
      }
      for (const std::string& line : result.exceeded) out << line << "\n";
      for (const std::string& line : result.unconfirmed) out << line << "\n";
      const bool met = result.confirmed() || (result.ok() && args->accept_lower_bounds);
      const char* at_least = result.figures.lower_bounds && !result.figures.peaks_from_stats ? ">= " : "";
      if (met) {
        out << "all budgets met: peak reserved " << at_least << analyzer::format_bytes(result.figures.peak_reserved)
            << ", peak allocated " << at_least << analyzer::format_bytes(result.figures.peak_allocated) << "\n";
      }
      if (!result.figures.category_source.empty())
        out << "note: the categories' peaks are " << result.figures.category_source_note << "\n";
      if (const std::string note = analyzer::peaks_note(result.figures); !note.empty()) out << "note: " << note << "\n";
    }, /*verdict_on_whole_recording=*/true});
  });
}

}  // namespace cachealloc::cli
