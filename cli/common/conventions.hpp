// The one command-line convention of every cachealloc executable, as users of
// memray, heaptrack_print and git expect it:
//   - a usage error is one line on stderr, "PROGRAM: error: ...", naming the
//     valid choices or range, with a did-you-mean for a mistyped subcommand
//     or option; exit 2;
//   - --help, --version and -V print to stdout and exit 0;
//   - unreadable or bad input is exit 2 with one line; exit 1 means an
//     internal error (a bug), never a user's mistake.
// CLI11 parses; no CLI11 message reaches the user (translate_parse_error).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace cachealloc::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitUsage = 2;

// Bad usage or bad input found by our own checks: exit 2, what() on one line.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// " (did you mean 'summary'?)" when one candidate is within two edits of
// `word` (or starts with it), else "".
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

// "'xml' is not one of table, csv, json": a check that names the choices.
CLI::Validator one_of(std::vector<std::string> choices);
// "'-3' is not a whole number from 1 to 100000".
CLI::Validator whole_number(long long min, long long max);
// "'nan' is not a number from 0.01 to 3600": NaN and infinities are refused
// too (CLI::Range lets NaN through, as every comparison with it is false).
CLI::Validator number_from(double min, double max);

// --help's usage line of `app` (not of its subcommands): "Usage: " + `usage`.
void set_usage(CLI::App& app, std::string usage);

// --version and -V print `text` and exit 0.
void add_version_flags(CLI::App& app, const std::string& text);

// Every name an option of `app` answers to ("--limit", "-o"), and whether it
// takes a value.
struct OptionName {
  std::string name;
  bool takes_value = false;
};
std::vector<OptionName> option_names(const CLI::App& app);

// Throws UsageError for the first token of `args` that looks like an option
// and is not one of `app`'s: "unknown option '--limt' (did you mean
// '--limit'?)". Values of options and negative numbers are not options.
void check_options(const CLI::App& app, const std::vector<std::string>& args);

// The message for a CLI11 parse error, in our words.
std::string translate_parse_error(const CLI::ParseError& error);

// Checks `args` (argv without argv[0]) against the options of `options_of`
// (default: `app`) and parses them into `app`. Returns an exit code when
// the program should stop now (--help, --version: 0, after printing; an
// error: 2, after one line on stderr), else nullopt.
std::optional<int> parse(CLI::App& app, const char* program, std::vector<std::string> args,
                         const CLI::App* options_of = nullptr);

// Runs `body` and turns what it throws into the exit codes above, with one
// line on stderr.
int run_guarded(const char* program, const std::function<int()>& body);

// Prints "PROGRAM: error: MESSAGE" and returns 2.
int usage_error(const char* program, const std::string& message);

}  // namespace cachealloc::cli
