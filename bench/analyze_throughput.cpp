// Analyzer throughput and memory: the one-pass summary + peak + fragmentation
// analysis over a large snapshot, results in docs/PERFORMANCE.md ("Analyzer").
//
//   cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o /tmp/s3m.bin
//   bench_analyze_throughput /tmp/s3m.bin
//   bench_analyze_throughput --rewrite 5 /tmp/s3m.bin /tmp/s3m_v5.bin
//   bench_analyze_throughput --one-core /tmp/s3m.bin   (the first figure alone)
//
// --rewrite writes the snapshot again as format version 5 (event encoding 2)
// or 6 (encoding 3), so that one binary compares the two encodings
// (docs/FORMAT.md, "Encoding 3 (format version 6)").
//
// Reports, best of 3 runs each:
//   - decode + analysis, streaming, one core: FileEvents reads and decodes
//     one block at a time and the analysis consumes it;
//   - the same with blocks decoded ahead on FileEvents::default_decode_threads()
//     threads (what cachealloc-analyze does by default), the analysis itself
//     still on one core;
//   - decode + analysis in ranges on ANALYSIS_THREADS threads (default: one
//     per core), each decoding its own blocks (AnalysisOptions::threads);
//   - decode + analysis, load everything: snapshot::load(), then analyze();
//   - analysis alone: analyze() over a snapshot already in memory;
//   - decode alone: every block of the file decoded, nothing analyzed; where
//     the decoder merges varints with PEXT, again with the portable merge.
// and the peak RSS (getrusage ru_maxrss) of one streaming run and one
// load-everything run, each in a fresh process (this binary re-executed with
// --child), so neither inherits the other's pages.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>

#include "best_of.hpp"
#include "guarded.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/snapshot/detail/cores.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/load.hpp"

using namespace cachealloc;
using bench::seconds_best_of_3;

namespace {

// What summary, peak and fragmentation need, in one pass: the peaks and
// counts always, plus 20 slices with fragmentation figures.
analyzer::AnalysisOptions one_pass_options() {
  analyzer::AnalysisOptions options;
  options.timeline = analyzer::AnalysisOptions::Timeline::buckets;
  options.buckets = 20;
  options.sample_fragmentation = true;
  return options;
}

// Keeps the optimizer from dropping an analysis whose result is unused.
volatile std::uint64_t g_sink = 0;

void streaming_run(const char* path, unsigned decode_threads = 0, unsigned analysis_threads = 1) {
  analyzer::FileEvents source(path, decode_threads);
  analyzer::AnalysisOptions options = one_pass_options();
  options.threads = analysis_threads;
  const analyzer::Analysis a = analyzer::analyze(source, options);
  if (analysis_threads > 1 && a.threads != analysis_threads) {
    std::fprintf(stderr, "the parallel analysis ran on %u threads, not %u\n", a.threads, analysis_threads);
    std::exit(1);
  }
  g_sink = g_sink + a.peak_allocated.bytes;
}

void load_everything_run(const char* path) {
  const snapshot::Snapshot snapshot = snapshot::load(path);
  g_sink = g_sink + analyzer::analyze(snapshot, one_pass_options()).peak_allocated.bytes;
}

// Peak RSS in KiB of this binary re-executed as `--child mode path`.
long child_max_rss_kib(const char* self, const char* mode, const char* path) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(self, self, "--child", mode, path, static_cast<char*>(nullptr));
    std::perror("exec");
    std::_Exit(127);
  }
  int status = 0;
  struct rusage usage {};
  if (pid < 0 || ::wait4(pid, &status, 0, &usage) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "the %s child failed\n", mode);
    std::exit(1);
  }
  return usage.ru_maxrss;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Args args(argc, argv,
                         "SNAPSHOT [DECODE_THREADS [ANALYSIS_THREADS]]\n"
                         "       bench_analyze_throughput --one-core SNAPSHOT\n"
                         "       bench_analyze_throughput --rewrite 5|6 SNAPSHOT OUT\n"
                         "  make one with: cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 "
                         "-o /tmp/s3m.bin",
                         4);
  if (!args.has(1)) args.fail("a snapshot is needed");
  const std::string_view mode = args[1];
  return bench::guarded(args, [&] {
    if (mode == "--child") {
      if (!args.has(3)) args.fail("--child takes a mode and a snapshot");
      const std::string which = args.word(2, "", {"streaming", "ahead", "load"}, "the child's mode");
      if (which == "streaming") {
        streaming_run(args[3]);
      } else if (which == "ahead") {
        streaming_run(args[3], analyzer::FileEvents::default_decode_threads());
      } else {
        load_everything_run(args[3]);
      }
      return 0;
    }
    if (mode == "--one-core") {
      // The first line's figure alone, for a sweep over the host's CPUs
      // (taskset -c N): best of 3, one line.
      if (!args.has(2) || args.has(3)) args.fail("--one-core takes one snapshot");
      const double events = static_cast<double>(analyzer::FileEvents(args[2]).event_count());
      const double s = seconds_best_of_3([&] { streaming_run(args[2]); });
      std::printf("decode + analysis, streaming, one core %8.3f s  %6.1f M events/s\n", s, events / s / 1e6);
      return 0;
    }
    if (mode == "--rewrite") {
      if (!args.has(4)) args.fail("--rewrite takes a version, a snapshot and an output file");
      const auto version = args.count<std::uint32_t>(2, 6, 5, 6, "the format version");
      const std::vector<std::byte> bytes = snapshot::detail::encode_as_version(snapshot::load(args[3]), version);
      std::FILE* out = std::fopen(args[4], "wb");
      if (out == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), out) != bytes.size() || std::fclose(out) != 0)
        throw std::filesystem::filesystem_error("cannot write", args[4], std::make_error_code(std::errc::io_error));
      std::printf("%s: format version %u, %zu bytes\n", args[4], version, bytes.size());
      return 0;
    }
    if (mode.starts_with("-")) args.fail("unknown option '" + std::string(mode) + "'");
    const char* path = args[1];
    // Read before anything else, so that a file that is not a snapshot is
    // one line here, not a failed child.
    analyzer::FileEvents probe(path);
    const auto cores = static_cast<unsigned>(snapshot::detail::usable_cores());
    const unsigned helpers = args.count<unsigned>(2, analyzer::FileEvents::default_decode_threads(), 0, 256,
                                                  "DECODE_THREADS");
    const unsigned ranges = args.count<unsigned>(3, cores, 1, 1024, "ANALYSIS_THREADS");
    // Memory first, from a parent that holds nothing yet but the probe's head.
    const long streaming_kib = child_max_rss_kib("/proc/self/exe", "streaming", path);
    const long ahead_kib = child_max_rss_kib("/proc/self/exe", "ahead", path);
    const long loading_kib = child_max_rss_kib("/proc/self/exe", "load", path);

    const double events = static_cast<double>(probe.event_count());
    std::printf("file: %s, %.0f events in %zu blocks, format version %u, streamed: %s\n", path, events,
                probe.block_count(), probe.head().header.format_version, probe.streaming() ? "yes" : "no");

    const double streaming = seconds_best_of_3([&] { streaming_run(path); });
    const double prefetched = seconds_best_of_3([&] { streaming_run(path, helpers); });
    const double in_ranges = seconds_best_of_3([&] { streaming_run(path, 0, ranges); });
    const double loading = seconds_best_of_3([&] { load_everything_run(path); });
    const double decode_only = seconds_best_of_3([&] {
      analyzer::FileEvents source(path);
      for (std::size_t b = 0; b < source.block_count(); ++b) g_sink = g_sink + source.block(b).size();
    });
    // The same with the decoder's portable varint merge, where it uses PEXT
    // (snapshot::detail::varint_pext): the two side by side, one run.
    const bool pext = snapshot::detail::varint_pext();
    double decode_portable = 0;
    if (pext) {
      snapshot::detail::set_varint_pext(false);
      decode_portable = seconds_best_of_3([&] {
        analyzer::FileEvents source(path);
        for (std::size_t b = 0; b < source.block_count(); ++b) g_sink = g_sink + source.block(b).size();
      });
      snapshot::detail::set_varint_pext(true);
    }
    const snapshot::Snapshot snapshot = snapshot::load(path);
    const double analysis_only = seconds_best_of_3(
        [&] { g_sink = g_sink + analyzer::analyze(snapshot, one_pass_options()).peak_allocated.bytes; });

    auto line = [&](const char* what, double s) {
      std::printf("%-46s %8.3f s  %6.1f M events/s\n", what, s, events / s / 1e6);
    };
    std::printf("one pass: summary + peak + fragmentation (20 sampled slices), best of 3\n");
    line("decode + analysis, streaming, one core", streaming);
    std::printf("%-46s %8.3f s  %6.1f M events/s\n",
                ("decode on " + std::to_string(helpers) + " more threads, analysis on one").c_str(), prefetched,
                events / prefetched / 1e6);
    std::printf("%-46s %8.3f s  %6.1f M events/s\n",
                ("decode + analysis in ranges on " + std::to_string(ranges) + " threads").c_str(), in_ranges,
                events / in_ranges / 1e6);
    line("decode + analysis, load everything first", loading);
    line(pext ? "decode alone (every block, no analysis), PEXT" : "decode alone (every block, no analysis)", decode_only);
    if (pext) line("decode alone, portable varint merge", decode_portable);
    line("analysis alone (snapshot in memory)", analysis_only);
    std::printf("peak RSS, fresh process each:\n");
    std::printf("%-46s %8.1f MiB\n", "streaming, one core", static_cast<double>(streaming_kib) / 1024.0);
    std::printf("%-46s %8.1f MiB\n", "streaming, blocks decoded ahead", static_cast<double>(ahead_kib) / 1024.0);
    std::printf("%-46s %8.1f MiB\n", "load everything", static_cast<double>(loading_kib) / 1024.0);
    return 0;
  });
}
