#include "conventions.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <exception>
#include <sstream>

#include <unistd.h>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/text.hpp"

namespace cachealloc::cli {

namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

bool looks_like_number(std::string_view token) {
  if (token.size() < 2 || token[0] != '-') return false;
  return std::all_of(token.begin() + 1, token.end(), [](char c) { return (c >= '0' && c <= '9') || c == '.'; });
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ", ") + item;
  return text;
}

// "The following arguments were not expected: 3 --x" -> "3".
std::string first_after_colon(const std::string& message) {
  const std::size_t colon = message.find(": ");
  if (colon == std::string::npos) return message;
  std::string rest = message.substr(colon + 2);
  const std::size_t space = rest.find(' ');
  return space == std::string::npos ? rest : rest.substr(0, space);
}

// An option another subcommand spells differently means what this one's
// does, however near in spelling a third is: the moment of a state is --at
// for summary and segments and --to (the window's end) for peak, so
// "peak --at 5" wants --to, not --all.
std::string same_idea(const std::string& name, const std::vector<std::string>& long_names) {
  static const std::pair<const char*, const char*> kSameIdea[] = {{"--at", "--to"}, {"--at-time", "--to"}, {"--to", "--at"}};
  for (const auto& [asked, meant] : kSameIdea)
    if (name == asked && std::find(long_names.begin(), long_names.end(), meant) != long_names.end())
      return std::string(" (did you mean '") + meant + "'?)";
  return did_you_mean(name, long_names);
}

}  // namespace

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_distance = 3;
  for (const std::string& candidate : candidates) {
    std::size_t distance = edit_distance(word, candidate);
    // A word that begins a candidate ("leak" of "leaks") is nearer than any
    // candidate one edit away ("peak").
    if (word.size() >= 3 && candidate.starts_with(word)) distance = 0;
    const std::size_t allowed = std::max<std::size_t>(word.size(), candidate.size()) <= 4 ? 1 : 2;
    if (distance <= allowed && distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best.empty() ? std::string() : " (did you mean '" + best + "'?)";
}

CLI::Validator one_of(std::vector<std::string> choices) {
  const std::string description = "{" + [&] {
    std::string text;
    for (const std::string& c : choices) text += (text.empty() ? "" : ",") + c;
    return text;
  }() + "}";
  return CLI::Validator(
      [choices](std::string& value) -> std::string {
        if (std::find(choices.begin(), choices.end(), value) != choices.end()) return {};
        return "'" + value + "' is not one of " + join(choices) + did_you_mean(value, choices);
      },
      description);
}

CLI::Validator whole_number(long long min, long long max) {
  const std::string range = std::to_string(min) + " to " + std::to_string(max);
  return CLI::Validator(
      [min, max, range](std::string& value) -> std::string {
        long long number = 0;
        const char* end = value.data() + value.size();
        const auto [at, error] = std::from_chars(value.data(), end, number);
        if (error != std::errc() || at != end || number < min || number > max)
          return "'" + value + "' is not a whole number from " + range;
        return {};
      },
      "INT in " + std::to_string(min) + ".." + std::to_string(max));
}

CLI::Validator number_from(double min, double max) {
  auto shortest = [](double value) {
    std::ostringstream text;
    text << value;
    return text.str();
  };
  const std::string range = shortest(min) + " to " + shortest(max);
  return CLI::Validator(
      [min, max, range](std::string& value) -> std::string {
        double number = 0;
        const char* end = value.data() + value.size();
        const auto [at, error] = std::from_chars(value.data(), end, number);
        // Written as a negation so that NaN, for which every comparison is false, fails it.
        if (error != std::errc() || at != end || !(number >= min && number <= max))
          return "'" + value + "' is not a number from " + range;
        return {};
      },
      "NUMBER in " + range);
}

namespace {
class UsageFormatter : public CLI::Formatter {
 public:
  explicit UsageFormatter(std::string usage) : usage_(std::move(usage)) {}
  std::string make_usage(const CLI::App* /*app*/, std::string /*name*/) const override {
    return "Usage: " + usage_ + "\n";
  }

 private:
  std::string usage_;
};
}  // namespace

void set_usage(CLI::App& app, std::string usage) { app.formatter(std::make_shared<UsageFormatter>(std::move(usage))); }

void add_version_flags(CLI::App& app, const std::string& text) {
  app.add_flag_callback("-V,--version", [text] { throw CLI::CallForVersion(text, 0); }, "print the version and exit");
}

std::vector<OptionName> option_names(const CLI::App& app) {
  std::vector<OptionName> names;
  for (const CLI::Option* option : app.get_options()) {
    // A flag has a type size too (CLI11 reads "--flag=false"), but expects no value after it.
    const bool takes_value = option->get_type_size_max() > 0 && option->get_expected_max() > 0;
    for (const std::string& name : option->get_lnames()) names.push_back({"--" + name, takes_value});
    for (const std::string& name : option->get_snames()) names.push_back({"-" + name, takes_value});
  }
  return names;
}

void check_options(const CLI::App& app, const std::vector<std::string>& args) {
  const std::vector<OptionName> names = option_names(app);
  std::vector<std::string> long_names;
  for (const OptionName& name : names) {
    if (name.name.starts_with("--")) long_names.push_back(name.name);
  }
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& token = args[i];
    if (token == "--") return;
    if (token.size() < 2 || token[0] != '-' || looks_like_number(token)) continue;
    const std::string name = token.substr(0, token.find('='));
    const auto known = std::find_if(names.begin(), names.end(), [&](const OptionName& n) { return n.name == name; });
    if (known != names.end()) {
      if (known->takes_value && name.size() == token.size()) ++i;  // its value
      continue;
    }
    // -ofile: a short option with its value attached.
    if (token[1] != '-') {
      const std::string short_name = token.substr(0, 2);
      const auto attached =
          std::find_if(names.begin(), names.end(), [&](const OptionName& n) { return n.name == short_name; });
      if (attached != names.end() && attached->takes_value) continue;
    }
    throw UsageError("unknown option '" + name + "'" + same_idea(name, long_names));
  }
}

std::string translate_parse_error(const CLI::ParseError& error) {
  // By type: CLI11 names some errors after the subcommand that threw them.
  const std::string message = error.what();
  auto is = [&error]<class T>(T*) { return dynamic_cast<const T*>(&error) != nullptr; };
  if (is((CLI::ExtrasError*)nullptr)) return "unexpected argument '" + first_after_colon(message) + "' (see --help)";
  if (is((CLI::RequiredError*)nullptr)) {
    const std::string suffix = " is required";
    if (message.ends_with(suffix)) return "missing " + message.substr(0, message.size() - suffix.size()) + " (see --help)";
    return "missing arguments (see --help)";
  }
  if (is((CLI::ConversionError*)nullptr)) {
    // "Could not convert: --limit = abc"
    const std::size_t colon = message.find(": ");
    const std::size_t equals = message.find(" = ");
    if (colon != std::string::npos && equals != std::string::npos && equals > colon)
      return message.substr(colon + 2, equals - colon - 2) + ": '" + message.substr(equals + 3) + "' is not a valid value";
    return "a value could not be read (see --help)";
  }
  if (is((CLI::ArgumentMismatch*)nullptr)) {
    const std::string option = message.substr(0, message.find(':'));
    if (message.find("missing") != std::string::npos || message.find("requires") != std::string::npos)
      return option + " needs a value";
    return option + ": too many values";
  }
  if (is((CLI::ExcludesError*)nullptr)) {
    // "--at excludes --to"
    const std::size_t at = message.find(" excludes ");
    if (at != std::string::npos)
      return message.substr(0, at) + " and " + message.substr(at + 10) + " cannot be used together";
  }
  if (is((CLI::ValidationError*)nullptr)) return message;  // "--format: 'xml' is not one of ...", our own words
  return message;
}

namespace {
// On a terminal, a progress line ("\rsummary:  42%") may stand unfinished
// where an error interrupts the work: the error line replaces it.
const char* line_start() noexcept { return isatty(STDERR_FILENO) ? "\r\033[K" : ""; }
}  // namespace

int usage_error(const char* program, const std::string& message) {
  std::fprintf(stderr, "%s%s: error: %s\n", line_start(), program, snapshot::printable(message).c_str());
  return kExitUsage;
}

std::optional<int> parse(CLI::App& app, const char* program, std::vector<std::string> args, const CLI::App* options_of) {
  try {
    check_options(options_of != nullptr ? *options_of : app, args);
    std::reverse(args.begin(), args.end());  // CLI11 takes them last first
    app.parse(args);
  } catch (const UsageError& error) {
    return usage_error(program, error.what());
  } catch (const CLI::Success& success) {
    return app.exit(success);  // --help, --version: to stdout, exit 0
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);
    return usage_error(program, translate_parse_error(error));
  }
  return std::nullopt;
}

int run_guarded(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& error) {
    return usage_error(program, error.what());
  } catch (const snapshot::SnapshotError& error) {
    return usage_error(program, error.what());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s%s: internal error: %s\n", line_start(), program, snapshot::printable(error.what()).c_str());
    return kExitInternal;
  }
}

}  // namespace cachealloc::cli
