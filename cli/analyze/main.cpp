// cachealloc-analyze: answers about a memory-history snapshot.
// Exit codes: 0 the input was read and the report written; 2 bad usage or
// unreadable input (one line on stderr, "cachealloc-analyze: error: ...");
// 1 an internal error.
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "cachealloc/errors.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "command.hpp"

namespace {

using namespace cachealloc::cli;

bool is_help_or_version(const std::string& token) {
  return token == "-h" || token == "--help" || token == "-V" || token == "--version";
}

bool looks_like_a_word(const std::string& token) {
  if (token.empty() || !std::isalpha(static_cast<unsigned char>(token[0]))) return false;
  for (const char c : token) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

// Puts the subcommand first, wherever the user wrote it ("FILE peak" works
// as the usage line says), supplies summary when there is none, and names a
// mistyped one. Throws UsageError.
void arrange(CLI::App& app, std::vector<std::string>& args) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
  // Which options take a value, over every subcommand: their values are not positionals.
  std::set<std::string> takes_value;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    for (const OptionName& option : option_names(*sub)) {
      if (option.takes_value) takes_value.insert(option.name);
    }
  }
  std::vector<std::size_t> positionals;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& token = args[i];
    if (token == "--") {
      for (std::size_t j = i + 1; j < args.size(); ++j) positionals.push_back(j);
      break;
    }
    if (token.size() > 1 && token[0] == '-') {
      if (takes_value.contains(token)) ++i;
      continue;
    }
    positionals.push_back(i);
  }
  std::vector<std::size_t> subcommands;
  for (const std::size_t i : positionals) {
    if (std::find(names.begin(), names.end(), args[i]) != names.end()) subcommands.push_back(i);
  }
  if (subcommands.size() > 1)
    throw UsageError("one subcommand at a time: '" + args[subcommands[0]] + "' and '" + args[subcommands[1]] + "'");
  if (subcommands.size() == 1) {
    const std::string name = args[subcommands[0]];
    args.erase(args.begin() + static_cast<std::ptrdiff_t>(subcommands[0]));
    args.insert(args.begin(), name);
    return;
  }
  // No subcommand: a word that is not a file is a mistyped one.
  for (const std::size_t i : positionals) {
    const std::string& token = args[i];
    std::error_code error;
    if (token == "-" || std::filesystem::exists(token, error) || !looks_like_a_word(token)) continue;
    std::string hint = did_you_mean(token, names);
    if (token == "help") hint = " (did you mean '--help'?)";
    if (token == "stats") hint = " (did you mean 'summary'?)";
    if (!hint.empty()) throw UsageError("unknown subcommand '" + token + "'" + hint);
    throw UsageError("'" + token + "' is neither a subcommand nor a file (subcommands: " + [&] {
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
      return list;
    }() + ")");
  }
  const bool only_help = std::any_of(args.begin(), args.end(), is_help_or_version) && positionals.empty();
  if (!only_help) args.insert(args.begin(), "summary");  // the default subcommand
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "Analyze a cachealloc memory-history snapshot (or a PyTorch memory-snapshot pickle).\n"
      "Without a subcommand, prints the summary; FILE SUBCOMMAND works as well as SUBCOMMAND FILE.\n"
      "FILE may be gzip or zstd compressed; - reads standard input.",
      kProgram);
  Runner runner;
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
  add_flamegraph_command(app, runner);
  add_html_command(app, runner);
  add_diff_command(app, runner);
  add_ranks_command(app, runner);
  add_replay_command(app, runner);
  add_check_command(app, runner);
  add_recommend_command(app, runner);
  add_version_flags(app, std::string(kProgram) + " " CACHEALLOC_VERSION);
  app.require_subcommand(0, 1);
  set_usage(app, "cachealloc-analyze [SUBCOMMAND] FILE [OPTIONS]");
  app.footer(
      "Examples:\n"
      "  cachealloc-analyze run.bin                       # summary\n"
      "  cachealloc-analyze run.bin peak                  # who held the memory at the peak\n"
      "  cachealloc-analyze oom run.bin.zst               # why it ran out of memory\n"
      "  ssh gpu-host cat run.bin | cachealloc-analyze -  # standard input\n"
      "  cachealloc-analyze timeline run.bin --buckets 100 --format csv -o timeline.csv\n"
      "  cachealloc-analyze convert run.bin -o run.pickle  # for PyTorch's _memory_viz\n"
      "Every subcommand takes --format table|csv|json, -o FILE (-f to overwrite), --from/--to EVENT|TIME\n"
      "and --device N.\n"
      "Exit status: 0 done; 2 bad usage or an input that is not a readable snapshot (one line on stderr);\n"
      "1 an internal error.");
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    arrange(app, args);
  } catch (const UsageError& error) {
    return usage_error(kProgram, error.what());
  }
  // Unknown options are named against the subcommand's own.
  const CLI::App* checked = &app;
  if (!args.empty()) {
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      if (sub->get_name() == args[0]) checked = sub;
    }
  }
  if (const std::optional<int> stop = parse(app, kProgram, args, checked)) return *stop;
  return run_guarded(kProgram, [&] {
    try {
      runner.run();
    } catch (const cachealloc::snapshot::SnapshotError& error) {
      if (error.code() == cachealloc::snapshot::ErrorCode::io) throw;  // it names the path and the reason
      const std::string input = runner.common.file == "-" ? "standard input" : runner.common.file;
      throw UsageError("cannot read " + input + ": " + error.what());
    } catch (const cachealloc::InvalidArgument& error) {
      throw UsageError(error.what());  // a request the file cannot answer (a window before the ring)
    }
    for (const std::string& note : *runner.notes) std::fprintf(stderr, "%s: note: %s\n", kProgram, note.c_str());
    return *runner.verdict;
  });
}
