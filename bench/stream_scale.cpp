// A whole run streamed and analyzed at scale: cachealloc-synthetic's
// training loop recorded as a streamed recording of N events (every event
// on disk, none held in memory: HistoryOptions::stream), then `summary` of
// that file on one core. Results in docs/PERFORMANCE.md ("Streamed
// recordings at scale").
//
//   bench_stream_scale FILE [EVENTS [STACKS]]     EVENTS default 100000000; STACKS none (default) or native
//   bench_stream_scale --analyze FILE             the analysis alone, of a stream made before
//
// Each phase runs in a child process of its own (fork), so its peak RSS
// (getrusage ru_maxrss, from wait4) is its own:
//   - record: one thread runs the loop on a simulated H200, the stream's
//     writer thread compresses and writes; events/s of the loop's events;
//   - analyze: summary_report over FileEvents, blocks decoded on the calling
//     thread (no decoding threads) and the analysis on one thread: one core.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>

#include "args.hpp"
#include "guarded.hpp"
#include "workload.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/reports.hpp"

using namespace cachealloc;

namespace {

struct Phase {
  double seconds = 0;
  long max_rss_kib = 0;
};

// Runs `body` in a child; its wall time and peak RSS. Exits on failure.
Phase in_child(const char* what, const std::function<int()>& body) {
  std::fflush(nullptr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      std::_Exit(body());
    } catch (const std::exception& error) {
      std::fprintf(stderr, "bench_stream_scale: error: %s\n", error.what());
      std::_Exit(1);
    }
  }
  int status = 0;
  struct rusage usage {};
  if (pid < 0 || ::wait4(pid, &status, 0, &usage) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "bench_stream_scale: the %s phase failed\n", what);
    std::exit(1);
  }
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), usage.ru_maxrss};
}

void analyze(const char* path) {
  const std::uint64_t events = analyzer::FileEvents(path).event_count();  // a bad file: one line, exit 2
  const Phase phase = in_child("analyze", [&] {
    analyzer::FileEvents source(path, 0);
    analyzer::ReportOptions options;
    options.threads = 1;
    const analyzer::Document document = analyzer::summary_report(source, options);
    return document.title.empty() ? 1 : 0;
  });
  std::printf("analyze (summary, one core): %12llu events %9.1f s %8.2f M events/s  peak RSS %7.1f MiB\n",
              static_cast<unsigned long long>(events), phase.seconds, static_cast<double>(events) / phase.seconds / 1e6,
              static_cast<double>(phase.max_rss_kib) / 1024);
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Args args(argc, argv, "FILE [EVENTS [none|native]]\n       bench_stream_scale --analyze FILE", 3);
  if (!args.has(1)) args.fail("a file to write is needed");
  return bench::guarded(args, [&] {
    if (std::string(args[1]) == "--analyze") {
      if (!args.has(2)) args.fail("--analyze takes a stream");
      analyze(args[2]);
      return 0;
    }
    synthetic::WorkloadOptions options;
    options.events = args.count<std::uint64_t>(2, 100'000'000, 1, std::uint64_t{1} << 40, "EVENTS");
    options.stacks = parse_stack_capture(args.word(3, "none", {"none", "native"}, "STACKS"));
    options.seed = 1;
    options.stream = true;
    const std::filesystem::path path = args[1];
    const Phase record = in_child("record", [&] {
      const synthetic::WorkloadResult result = synthetic::run_workload(options, path);
      std::printf("record: %llu events written, %llu dropped, %llu waits for the writer, %llu chunks spilled, "
                  "buffers at most %.1f MiB\n",
                  static_cast<unsigned long long>(result.stream.events_written),
                  static_cast<unsigned long long>(result.stream.dropped_events),
                  static_cast<unsigned long long>(result.stream.waits),
                  static_cast<unsigned long long>(result.stream.spilled_chunks),
                  static_cast<double>(result.stream.peak_buffer_bytes) / (1 << 20));
      std::fflush(stdout);  // the child ends with _Exit
      return result.stream.error.empty() ? 0 : 1;
    });
    const std::uint64_t events = analyzer::FileEvents(path).event_count();
    std::printf("record (stream, stacks %s):  %12llu events %9.1f s %8.2f M events/s  peak RSS %7.1f MiB  %.2f GB, "
                "%.2f B/event\n",
                to_string(options.stacks), static_cast<unsigned long long>(events), record.seconds,
                static_cast<double>(events) / record.seconds / 1e6, static_cast<double>(record.max_rss_kib) / 1024,
                static_cast<double>(std::filesystem::file_size(path)) / 1e9,
                static_cast<double>(std::filesystem::file_size(path)) / static_cast<double>(events));
    analyze(args[1]);
    return 0;
  });
}
