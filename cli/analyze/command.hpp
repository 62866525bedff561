// What every cachealloc-analyze subcommand shares: the common options, and
// the one path from a file name to printed output (load, build the report,
// render, write). A subcommand file only declares its own options and says
// which job it registers: a report, a writer, a snapshot job or a files job.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include "../common/conventions.hpp"
#include "../common/output.hpp"
#include "cachealloc/analyzer/document.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/snapshot/input.hpp"
#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::cli {

inline constexpr const char* kProgram = "cachealloc-analyze";

struct CommonOptions {
  std::string file;
  std::string format = "table";
  std::string output;
  bool force = false;
  std::string table;  // --table: the one table CSV writes
  std::string from;
  std::string to;
  std::string to_option = "--to";  // the option that set `to` (summary --at)
  int device = -1;
  unsigned decode_threads = analyzer::FileEvents::default_decode_threads();
  unsigned analysis_threads = 0;  // AnalysisOptions::threads: 0 is one per usable CPU
  analyzer::SiteFilter sites;
  std::vector<std::string> files;  // diff A B, ranks FILE... | DIR
  std::uint64_t max_inflate = snapshot::kDefaultMaxInflateRatio;  // --max-inflate
  bool follow = false;           // --follow: summary, timeline, check
  double follow_interval = 1.0;  // --follow-interval, seconds
};

// The four kinds of job a subcommand registers (Runner::select). Each reads
// its input its own way; the runner checks -o first, then does the job.
//
// One file's events, a report built from them; the runner renders it as
// --format says (to -o, or one CSV file per table with -o DIR/).
struct ReportJob {
  std::function<analyzer::Document(analyzer::EventSource&, analyzer::ReportOptions&)> build;
};
// One file's events, and text the job writes itself to -o's stream
// (flamegraph, html, check, export --what perfetto): no -o DIR/.
struct WriterJob {
  std::function<void(analyzer::EventSource&, analyzer::ReportOptions&, std::ostream&)> write;
  // check: the exit status is a verdict on the whole recording, which a
  // --follow interrupted before the trailer cannot give (Runner::follow).
  bool verdict_on_whole_recording = false;
};
// The whole snapshot, written to the -o file (convert): no -o DIR/.
struct SnapshotJob {
  std::function<void(const snapshot::Snapshot&, Output&)> write;
};
// Several files (diff, ranks): common.files, the options and -o's stream.
// Returns the document to render, or nothing when it wrote its own lines
// (ranks --format jsonl, the one format outside table/csv/json).
struct FilesJob {
  std::function<std::optional<analyzer::Document>(const std::vector<std::string>& files,
                                                  analyzer::ReportOptions& options, bool jsonl, std::ostream& out)>
      build;
};
using Job = std::variant<ReportJob, WriterJob, SnapshotJob, FilesJob>;

class Runner {
 public:
  explicit Runner(std::string default_format = "table") { common.format = std::move(default_format); }
  CommonOptions common;
  // The exit status after a successful run: 0, or a verdict (check: 1 a budget exceeded, 3 one unconfirmed).
  std::shared_ptr<int> verdict = std::make_shared<int>(0);
  // Notes on the input (a stream that lost its trailer) printed once the
  // command has succeeded: a failure prints its one error line alone.
  std::shared_ptr<std::vector<std::string>> notes = std::make_shared<std::vector<std::string>>();
  // Remembers the job of subcommand `name`; main() calls run() after parsing succeeded.
  void select(std::string name, Job job) {
    name_ = std::move(name);
    job_ = std::move(job);
  }
  bool selected() const { return job_.has_value(); }
  // Checks -o, reads the input, does the selected job and writes its output.
  // Throws UsageError or SnapshotError.
  void run() const;

 private:
  struct Destination;
  void run_job(const ReportJob& job, Destination& to) const;
  void run_job(const WriterJob& job, Destination& to) const;
  void run_job(const SnapshotJob& job, Destination& to) const;
  void run_job(const FilesJob& job, Destination& to) const;
  analyzer::ReportOptions one_file_options(analyzer::EventSource& source) const;
  // --follow: `once` on each read of the file (analyzer::follow_file), each
  // result to a fresh output, until the recording's trailer or Ctrl-C.
  // Interrupted before the trailer: with `verdict_on_whole_recording`, a
  // verdict of 0 becomes 3 (cannot conclude) with a note saying why;
  // otherwise, having read nothing, it is a UsageError (nothing to show).
  void follow(Destination& to, const std::function<void(analyzer::FileEvents& source)>& once,
              bool verdict_on_whole_recording = false) const;
  void write(const analyzer::Document& document, Destination& to) const;

  std::string name_;
  std::optional<Job> job_;
};

// Adds the options of a subcommand over several files: FILES (the
// positionals, `files_help`), --format (with jsonl when `jsonl`), -o, -f,
// --table, --device, --decode-threads, --max-inflate and the site options.
void add_files_options(CLI::App& command, CommonOptions& options, const std::string& files_help, bool jsonl);

// Adds --follow and --follow-interval (a streamed recording still being written).
void add_follow_options(CLI::App& command, CommonOptions& options);

// Adds --max-inflate, which every subcommand that reads a file takes.
void add_input_options(CLI::App& command, CommonOptions& options);

// Adds FILE, --format, -o, -f, --table, --from, --to, --device, the site
// options, --help and --version to `command`.
void add_common_options(CLI::App& command, CommonOptions& options);

// For a subcommand that covers the whole trace: throws UsageError naming
// `why` when --from or --to was given, so a window is never silently ignored.
void whole_trace_only(const CLI::App& command, const std::string& why);

// Parses an event index or a time ("1.5s"); throws UsageError naming `option`.
std::size_t event_point(analyzer::EventSource& source, const std::string& text, const char* option);
// Where a state or window ending at `text` ends (analyzer::parse_state_end):
// the number of events in it. An index past the last event is a UsageError.
std::size_t state_end(analyzer::EventSource& source, const std::string& text, const char* option);
// Parses a byte count with an optional K, M, G or T suffix (powers of 1024).
std::uint64_t byte_count(const std::string& text, const char* option);

// Issue 16: what-if replay and the CI gate.
void add_replay_command(CLI::App& app, Runner& runner);
void add_check_command(CLI::App& app, Runner& runner);
void add_recommend_command(CLI::App& app, Runner& runner);
void add_summary_command(CLI::App& app, Runner& runner);
void add_segments_command(CLI::App& app, Runner& runner);
void add_fragmentation_command(CLI::App& app, Runner& runner);
void add_timeline_command(CLI::App& app, Runner& runner);
void add_peak_command(CLI::App& app, Runner& runner);
void add_top_command(CLI::App& app, Runner& runner);
void add_leaks_command(CLI::App& app, Runner& runner);
void add_oom_command(CLI::App& app, Runner& runner);
void add_events_command(CLI::App& app, Runner& runner);
void add_export_command(CLI::App& app, Runner& runner);
void add_convert_command(CLI::App& app, Runner& runner);
void add_flamegraph_command(CLI::App& app, Runner& runner);
void add_html_command(CLI::App& app, Runner& runner);
// Issue 16: recordings compared.
void add_diff_command(CLI::App& app, Runner& runner);
void add_ranks_command(CLI::App& app, Runner& runner);

}  // namespace cachealloc::cli
