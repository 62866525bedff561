#include "command.hpp"

#include <cctype>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/follow.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/snapshot/stream.hpp"

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

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ", ") + item;
  return text;
}

// The devices a snapshot describes: its device table and its segments.
std::vector<std::int32_t> devices_of(const snapshot::Snapshot& head) {
  std::set<std::int32_t> devices;
  for (const snapshot::DeviceInfo& device : head.devices) devices.insert(device.index);
  for (const snapshot::Segment& segment : head.segments) devices.insert(segment.device);
  return {devices.begin(), devices.end()};
}

void check_device(const snapshot::Snapshot& head, int device) {
  if (device < 0) return;
  const std::vector<std::int32_t> devices = devices_of(head);
  if (devices.empty()) return;  // nothing says which: a trace without a device table
  for (const std::int32_t known : devices) {
    if (known == device) return;
  }
  std::vector<std::string> names;
  for (const std::int32_t known : devices) names.push_back(std::to_string(known));
  throw UsageError("--device " + std::to_string(device) + ": device " + std::to_string(device) +
                   " is not in this snapshot (devices: " + join(names) + ")");
}

std::string events_range(std::size_t count) {
  return count == 0 ? std::string("it has no events") : "events #0 to #" + std::to_string(count - 1);
}

// Fails now, as a usage error, on a --filter that is not a regular expression.
void check_site_filter(const snapshot::Snapshot& head, const analyzer::SiteFilter& sites) {
  try {
    const analyzer::SiteNamer check(head, sites);
  } catch (const std::regex_error& error) {
    throw UsageError("--filter: not a regular expression: " + std::string(error.what()));
  }
}

// -o, -f and --table: where the output goes.
void add_output_options(CLI::App& command, CommonOptions& options) {
  command.add_option("-o,--output", options.output,
                     "write to this file (- : stdout); with --format csv, DIR/ writes one file per table");
  command.add_flag("-f,--force", options.force, "overwrite the -o file if it exists");
  command.add_option("--table", options.table, "--format csv: write only this table (default: the report's main one; stderr names it and the others)");
}

// --frames, --all-frames and --filter: which frames name a site and are shown.
void add_site_options(CLI::App& command, analyzer::SiteFilter& sites) {
  command.add_option("--frames", sites.frames, "frames shown per stack, from the site outwards (0: all)")
      ->check(whole_number(0, 1000))
      ->capture_default_str();
  command.add_flag("--all-frames", sites.all_frames,
                   "show every frame: no filter of allocator, framework and interpreter frames");
  command.add_option("--filter", sites.drop, "also leave out frames matching this regular expression (repeatable)")
      ->expected(1)
      ->take_all();
}

}  // namespace

void add_input_options(CLI::App& command, CommonOptions& options) {
  command.add_option("--max-inflate", options.max_inflate,
                     "refuse a gzip or zstd input that inflates past RATIO times its size, a decompression bomb "
                     "(0: no bound)")
      ->option_text("RATIO")
      ->check(whole_number(0, 1'000'000'000))
      ->capture_default_str();
}

void add_files_options(CLI::App& command, CommonOptions& options, const std::string& files_help, bool jsonl) {
  command.add_option("FILES", options.files, files_help)->required();
  std::vector<std::string> formats{"table", "csv", "json"};
  if (jsonl) formats.emplace_back("jsonl");
  command.add_option("--format", options.format, jsonl ? "output format: table, csv, json or jsonl (one line per rank)"
                                                        : "output format: table, csv or json")
      ->check(one_of(formats))
      ->capture_default_str();
  add_output_options(command, options);
  command.add_option("--device", options.device, "device index in every file (default: the first in each)")
      ->check(whole_number(0, 65535));
  command.add_option("--decode-threads", options.decode_threads,
                     "threads decoding each file's blocks ahead of its analysis (0: none)")
      ->check(whole_number(0, 64))
      ->capture_default_str();
  add_input_options(command, options);
  add_site_options(command, options.sites);
  add_version_flags(command, std::string(kProgram) + " " CACHEALLOC_VERSION);
}

void whole_trace_only(const CLI::App& command, const std::string& why) {
  if (command.get_option("--from")->count() != 0 || command.get_option("--to")->count() != 0)
    throw UsageError(command.get_name() + ": " + why);
}

void add_common_options(CLI::App& command, CommonOptions& options) {
  command.add_option("FILE", options.file,
                     "snapshot: ours or a PyTorch pickle, gzip or zstd compressed or not; - reads standard input")
      ->required();
  command.add_option("--format", options.format, "output format: table, csv or json")
      ->check(one_of({"table", "csv", "json"}))
      ->capture_default_str();
  add_output_options(command, options);
  command.add_option("--from", options.from, "first event: an index, or a time since the first event (1.5s, 200ms)");
  command.add_option("--to", options.to, "last event, inclusive: an index or a time");
  command.add_option("--device", options.device, "device index (default: the first in the snapshot)")
      ->check(whole_number(0, 65535));
  command.add_option("--decode-threads", options.decode_threads,
                     "threads decoding the file's blocks ahead of the analysis (0: decode on the analysis thread)")
      ->check(whole_number(0, 64))
      ->capture_default_str();
  command.add_option("--analysis-threads", options.analysis_threads,
                     "threads analysing a whole trace in ranges of events, with the one-thread answer (0: one per CPU "
                     "this process may run on, from 6 up, else 1, and 1 for summary, timeline and peak, whose categories "
                     "walk follows the one pass; 1: one, with --decode-threads decoding ahead)")
      ->check(whole_number(0, 256))
      ->capture_default_str();
  add_input_options(command, options);
  add_site_options(command, options.sites);
  add_version_flags(command, std::string(kProgram) + " " CACHEALLOC_VERSION);
}

std::size_t event_point(analyzer::EventSource& source, const std::string& text, const char* option) {
  std::string error;
  const std::optional<std::size_t> point = analyzer::parse_event_point(source, text, error);
  if (!point) throw UsageError(std::string(option) + ": " + error);
  return *point;
}

std::size_t state_end(analyzer::EventSource& source, const std::string& text, const char* option) {
  std::string error;
  const std::optional<std::size_t> end = analyzer::parse_state_end(source, text, error);
  if (!end) throw UsageError(std::string(option) + ": " + error);
  // An index past the last event names no state; a time past it is the end.
  std::size_t index = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), index);
  if (ec == std::errc{} && ptr == text.data() + text.size() && index >= source.event_count())
    throw UsageError(std::string(option) + " " + text + " is past the last event (" +
                     events_range(source.event_count()) + ")");
  return *end;
}

// 128 bits: a count times its unit never wraps before the bound check.
__extension__ typedef unsigned __int128 Wide;

std::uint64_t byte_count(const std::string& text, const char* option) {
  const std::string what =
      std::string(option) + ": '" + text + "' is not a byte count (a number such as 2.5G or 2900M, with K, M, G or T)";
  // Digits, an optional fraction, then an optional K/M/G/T (binary), 'i' and 'B'.
  std::size_t at = 0;
  Wide whole = 0, fraction = 0, scale = 1;
  while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) {
    whole = whole * 10 + static_cast<unsigned>(text[at++] - '0');
    if (whole > (std::uint64_t{1} << 62)) throw UsageError(what + ": too large");
  }
  const std::size_t digits = at;
  if (at < text.size() && text[at] == '.') {
    for (++at; at < text.size() && std::isdigit(static_cast<unsigned char>(text[at])); ++at) {
      if (scale > 1'000'000'000'000ULL) continue;  // finer than a byte even at T
      fraction = fraction * 10 + static_cast<unsigned>(text[at] - '0');
      scale *= 10;
    }
  }
  if (at == 0 || (digits == 0 && scale == 1)) throw UsageError(what);
  std::string suffix = text.substr(at);
  if (!suffix.empty() && (suffix.back() == 'B' || suffix.back() == 'b')) suffix.pop_back();
  if (suffix.size() > 1 && suffix.back() == 'i') suffix.pop_back();
  static const std::string kSuffixes = "KMGT";
  Wide unit = 1;
  if (!suffix.empty()) {
    const auto power = kSuffixes.find(static_cast<char>(std::toupper(static_cast<unsigned char>(suffix[0]))));
    if (suffix.size() != 1 || power == std::string::npos) throw UsageError(what);
    unit = Wide{1} << (10 * (power + 1));
  }
  const Wide bytes = whole * unit + fraction * unit / scale;
  if (bytes > (std::uint64_t{1} << 62)) throw UsageError(what + ": too large");
  return static_cast<std::uint64_t>(bytes);
}

// Where a job's output goes, settled before the input is read.
struct Runner::Destination {
  analyzer::Format format;
  bool jsonl = false;            // ranks --format jsonl: the job writes its own lines
  bool to_folder = false;        // -o DIR/: one CSV file per table, `output` empty
  std::optional<Output> output;  // stdout or the -o file
};

void Runner::run() const {
  if (!job_) throw std::logic_error("no subcommand selected");
  snapshot::set_max_inflate_ratio(common.max_inflate);
  // Only a files job may take jsonl (ranks: its --format check allows it);
  // only a report, or a files job's document, is rendered into -o DIR/.
  const bool files = std::holds_alternative<FilesJob>(*job_);
  const bool rendered = files || std::holds_alternative<ReportJob>(*job_);
  const bool jsonl = files && common.format == "jsonl";
  const std::optional<analyzer::Format> format = jsonl ? analyzer::Format::json : analyzer::parse_format(common.format);
  if (!format) throw UsageError("--format: expected table, csv or json");
  if (!common.table.empty() && *format != analyzer::Format::csv)
    throw UsageError("--table " + common.table + ": only with --format csv");
  // -o is checked before the input is read: a refusal costs nothing.
  const bool to_folder = !common.output.empty() && common.output != "-" && Output::names_directory(common.output);
  if (to_folder && (!rendered || *format != analyzer::Format::csv))
    throw UsageError("-o " + common.output + ": a folder takes only --format csv (one file per table)");
  Destination to{*format, jsonl, to_folder, std::nullopt};
  if (!to_folder) to.output.emplace(common.output, common.force);
  std::visit([&](const auto& job) { run_job(job, to); }, *job_);
}

void Runner::run_job(const FilesJob& job, Destination& to) const {
  analyzer::ReportOptions options;
  options.device = common.device;
  options.sites = common.sites;
  check_site_filter(snapshot::Snapshot{}, common.sites);
  std::ostringstream discard;
  const std::optional<analyzer::Document> document =
      job.build(common.files, options, to.jsonl, to.output ? to.output->stream() : static_cast<std::ostream&>(discard));
  if (document) return write(*document, to);
  to.output->commit();
}

void Runner::run_job(const SnapshotJob& job, Destination& to) const {
  job.write(analyzer::load(common.file), *to.output);
  to.output->commit();
}

namespace {
std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) { g_interrupted.store(true, std::memory_order_relaxed); }
}  // namespace

void add_follow_options(CLI::App& command, CommonOptions& options) {
  CLI::Option* follow = command.add_flag("--follow", options.follow,
                   "a streamed recording still being written: read it again as it grows and print the result "
                   "anew each time, until the recording ends (its trailer) or Ctrl-C");
  command.add_option("--follow-interval", options.follow_interval, "with --follow, seconds between looks at the file")
      ->check(number_from(0.01, 3600.0))
      ->needs(follow)
      ->capture_default_str();
}

void Runner::follow(Destination& to, const std::function<void(analyzer::FileEvents& source)>& once,
                    bool verdict_on_whole_recording) const {
  if (common.file == "-") throw UsageError("--follow: needs a file that grows, not standard input");
  if (to.to_folder) throw UsageError("--follow: -o takes a file (rewritten with each result), not a folder");
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  ::sigaction(SIGINT, &action, nullptr);
  analyzer::FollowOptions options;
  options.interval = std::chrono::milliseconds(static_cast<long>(common.follow_interval * 1000));
  options.decode_threads = common.decode_threads;
  options.stop = &g_interrupted;
  bool first = true;
  const analyzer::FollowEnd end =
      analyzer::follow_file(common.file, options, [&](analyzer::FileEvents& source, bool finished) {
        if (!first) to.output.emplace(common.output, true);  // each result whole: -o FILE holds the latest
        first = false;
        std::fprintf(stderr, "%s: %s: %zu events, %s\n", kProgram, common.file.c_str(), source.event_count(),
                     finished ? "the recording has ended" : "still being written");
        once(source);
      });
  if (end == analyzer::FollowEnd::finished) return;
  // Ctrl-C before the trailer. A gate that passed on part of the recording
  // has not passed: a CI job must not read 0 there. A budget already
  // exceeded stays exceeded (1): failing is the safe side.
  const std::string what = first ? "before " + common.file + " held a recording (nothing was read)"
                                 : "before the recording ended (its trailer was not read)";
  if (verdict_on_whole_recording) {
    if (*verdict != 1) {
      *verdict = 3;
      notes->push_back("interrupted " + what + ": the budgets are not confirmed (exit 3)");
    }
    return;
  }
  if (first) throw UsageError("--follow: interrupted " + what);
}

void Runner::run_job(const WriterJob& job, Destination& to) const {
  if (common.follow) {
    return follow(to, [&](analyzer::FileEvents& source) {
      analyzer::ReportOptions options = one_file_options(source);
      job.write(source, options, to.output->stream());
      to.output->commit();
    }, job.verdict_on_whole_recording);
  }
  analyzer::FileEvents source(common.file, common.decode_threads);
  analyzer::ReportOptions options = one_file_options(source);
  job.write(source, options, to.output->stream());
  to.output->commit();
}

void Runner::run_job(const ReportJob& job, Destination& to) const {
  if (common.follow) {
    return follow(to, [&](analyzer::FileEvents& source) {
      analyzer::ReportOptions options = one_file_options(source);
      write(job.build(source, options), to);
    });
  }
  analyzer::FileEvents source(common.file, common.decode_threads);
  analyzer::ReportOptions options = one_file_options(source);
  write(job.build(source, options), to);
}

// The options of a job over one file's events: the device, the site filter,
// the window of --from and --to, and a progress line on a terminal.
analyzer::ReportOptions Runner::one_file_options(analyzer::EventSource& source) const {
  check_device(source.head(), common.device);
  // A streamed recording that lost its trailer (snapshot/stream.hpp) reads up to its last complete chunk.
  // With --follow that is the normal state of a recording in progress: no note.
  if (const auto note = source.head().settings.find(snapshot::kStreamNoteSetting);
      note != source.head().settings.end() && !common.follow)
    notes->push_back(common.file + ": " + note->second);
  analyzer::ReportOptions options;
  options.device = common.device;
  options.sites = common.sites;
  options.threads = common.analysis_threads;
  check_site_filter(source.head(), common.sites);
  const std::size_t count = source.event_count();
  if (!common.from.empty()) {
    options.window.begin = event_point(source, common.from, "--from");
    if (options.window.begin >= count)
      throw UsageError("--from " + common.from + " is past the last event (" + events_range(count) + ")");
  }
  if (!common.to.empty()) {
    // An index is inclusive; a time takes every event at or before it.
    options.window.end = state_end(source, common.to, common.to_option.c_str());
    if (!common.from.empty() && options.window.begin >= options.window.end)
      throw UsageError("--from " + common.from + " is after " + common.to_option + " " + common.to + " (" +
                       common.to_option + " must be at or after --from)");
  }
  options.progress = progress_indicator(name_);
  return options;
}

void Runner::write(const analyzer::Document& document, Destination& to) const {
  if (to.format != analyzer::Format::csv) {
    analyzer::render(document, to.format, to.output->stream());
    to.output->commit();
    return;
  }
  const std::vector<std::string> tables = analyzer::csv_tables(document);
  if (!common.table.empty()) {
    if (std::find(tables.begin(), tables.end(), common.table) == tables.end())
      throw UsageError("--table: '" + common.table + "' is not a table of the " + name_ + " report (tables: " +
                       join(tables) + ")" + did_you_mean(common.table, tables));
    analyzer::render_csv_table(document, common.table, to.output->stream());
    to.output->commit();
    return;
  }
  if (to.to_folder) {
    if (::mkdir(common.output.c_str(), 0777) != 0 && errno != EEXIST)
      throw UsageError("cannot write " + common.output + ": " + std::strerror(errno));
    std::string folder = common.output;
    if (folder.back() != '/') folder += '/';
    for (const std::string& table : tables) {
      Output file(folder + name_ + "-" + table + ".csv", common.force);
      analyzer::render_csv_table(document, table, file.stream());
      file.commit();
      std::fprintf(stderr, "%s: wrote %s\n", kProgram, file.path().c_str());
    }
    return;
  }
  if (tables.size() > 1) {
    // The report's main table (the one render() writes), named on stderr
    // with the others, so a user gets CSV without knowing --table.
    const std::string chosen = document.csv_fields ? "fields" : !document.csv_table.empty() ? document.csv_table : tables[0];
    std::vector<std::string> others;
    for (const std::string& table : tables)
      if (table != chosen) others.push_back(table);
    std::fprintf(stderr, "%s: %s: wrote the '%s' table; also: %s (--table NAME, or -o DIR/ for all)\n", kProgram,
                 name_.c_str(), chosen.c_str(), join(others).c_str());
  }
  analyzer::render(document, to.format, to.output->stream());
  to.output->commit();
}

}  // namespace cachealloc::cli
