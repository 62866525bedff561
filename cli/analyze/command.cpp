#include "command.hpp"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <regex>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/load.hpp"

namespace cachealloc::cli {

namespace {

// "\r<name>: 42%" on a terminal, redrawn only when the percentage changes.
std::function<void(std::size_t, std::size_t)> progress_indicator(const std::string& name) {
  if (!isatty(STDERR_FILENO)) return {};
  auto last = std::make_shared<int>(-1);
  return [name, last](std::size_t done, std::size_t total) {
    const int percent = total == 0 ? 100 : static_cast<int>(done * 100 / total);
    if (percent == *last) return;
    *last = percent;
    std::fprintf(stderr, "\r%s: %3d%%", name.c_str(), percent);
    if (percent >= 100) std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  };
}

}  // namespace

void add_common_options(CLI::App& command, CommonOptions& options, bool file_required) {
  CLI::Option* file = command.add_option("FILE", options.file, "snapshot file written by cachealloc");
  if (file_required) file->required();
  command.add_option("--format", options.format, "output format")
      ->check(CLI::IsMember({"table", "csv", "json"}))
      ->capture_default_str();
  command.add_option("-o,--output", options.output, "write to this file instead of stdout");
  command.add_option("--from", options.from, "first event: an index, or a time since the first event (1.5s, 200ms)");
  command.add_option("--to", options.to, "last event, inclusive: an index or a time");
  command.add_option("--device", options.device, "device index (default: the first in the snapshot)");
  command.add_option("--decode-threads", options.decode_threads,
                     "threads decoding the file's blocks ahead of the analysis (0: decode on the analysis thread)")
      ->check(CLI::Range(0u, 64u))
      ->capture_default_str();
  command.add_option("--frames", options.sites.frames, "frames shown per stack, from the site outwards (0: all)")
      ->check(CLI::Range(0u, 1000u))
      ->capture_default_str();
  command.add_flag("--all-frames", options.sites.all_frames,
                   "show every frame: no filter of allocator, framework and interpreter frames");
  command.add_option("--filter", options.sites.drop,
                     "also leave out frames matching this regular expression (repeatable)")
      ->take_all();
  command.add_flag_callback(
      "--version", [] { throw CLI::CallForVersion("cachealloc-analyze " CACHEALLOC_VERSION, 0); },
      "print the version and exit");
}

std::size_t event_point(analyzer::EventSource& source, const std::string& text, const char* option) {
  std::string error;
  const std::optional<std::size_t> point = analyzer::parse_event_point(source, text, error);
  if (!point) throw UsageError(std::string(option) + ": " + error);
  return *point;
}

std::uint64_t byte_count(const std::string& text, const char* option) {
  std::size_t used = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &used);
  } catch (const std::exception&) {
    throw UsageError(std::string(option) + ": '" + text + "' is not a byte count");
  }
  std::string suffix = text.substr(used);
  if (!suffix.empty() && (suffix.back() == 'B' || suffix.back() == 'b')) suffix.pop_back();
  if (suffix.size() > 1 && suffix.back() == 'i') suffix.pop_back();
  static const std::string kSuffixes = "KMGT";
  if (suffix.empty()) return value;
  const auto power = kSuffixes.find(static_cast<char>(std::toupper(static_cast<unsigned char>(suffix[0]))));
  if (suffix.size() != 1 || power == std::string::npos)
    throw UsageError(std::string(option) + ": '" + text + "' is not a byte count");
  return value << (10 * (power + 1));
}

void Runner::run() const {
  const std::optional<analyzer::Format> format = analyzer::parse_format(common.format);
  if (!format) throw UsageError("--format: expected table, csv or json");
  // The only place a file is read; both sniff the content.
  if (action_) {
    action_(analyzer::load(common.file));
    return;
  }
  analyzer::FileEvents source(common.file, common.decode_threads);

  analyzer::ReportOptions options;
  options.device = common.device;
  options.sites = common.sites;
  try {
    const analyzer::SiteNamer check(source.head(), common.sites);
  } catch (const std::regex_error& error) {
    throw UsageError("--filter: not a regular expression: " + std::string(error.what()));
  }
  if (!common.from.empty()) options.window.begin = event_point(source, common.from, "--from");
  if (!common.to.empty()) {
    const std::size_t to = event_point(source, common.to, "--to");
    // A time names the first event at or after it; an index is inclusive.
    options.window.end = to < source.event_count() ? to + 1 : to;
  }
  if (options.window.begin > options.window.end) throw UsageError("--from is after --to");
  options.progress = progress_indicator(name_);
  const analyzer::Document document = build_(source, options);

  if (common.output.empty()) {
    analyzer::render(document, *format, std::cout);
    std::cout.flush();
    return;
  }
  std::ofstream out(common.output, std::ios::binary | std::ios::trunc);
  if (!out) throw UsageError("cannot write " + common.output);
  analyzer::render(document, *format, out);
  out.close();
  if (!out) throw UsageError("cannot write " + common.output);
}

}  // namespace cachealloc::cli
