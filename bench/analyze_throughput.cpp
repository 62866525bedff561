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
// (docs/PERFORMANCE.md, "Analyzer decode (session 8)").
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
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "best_of.hpp"
#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/event_source.hpp"
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
  if (argc == 4 && std::strcmp(argv[1], "--child") == 0) {
    if (std::strcmp(argv[2], "streaming") == 0) {
      streaming_run(argv[3]);
    } else if (std::strcmp(argv[2], "ahead") == 0) {
      streaming_run(argv[3], analyzer::FileEvents::default_decode_threads());
    } else {
      load_everything_run(argv[3]);
    }
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "--one-core") == 0) {
    // The first line's figure alone, for a sweep over the host's CPUs
    // (taskset -c N): best of 3, one line.
    try {
      const double events = static_cast<double>(analyzer::FileEvents(argv[2]).event_count());
      const double s = seconds_best_of_3([&] { streaming_run(argv[2]); });
      std::printf("decode + analysis, streaming, one core %8.3f s  %6.1f M events/s\n", s, events / s / 1e6);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "error: %s\n", error.what());
      return 1;
    }
    return 0;
  }
  if (argc == 5 && std::strcmp(argv[1], "--rewrite") == 0) {
    try {
      const auto version = static_cast<std::uint32_t>(std::atoi(argv[2]));
      const std::vector<std::byte> bytes = snapshot::detail::encode_as_version(snapshot::load(argv[3]), version);
      std::FILE* out = std::fopen(argv[4], "wb");
      if (out == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), out) != bytes.size() || std::fclose(out) != 0) {
        std::fprintf(stderr, "error: cannot write %s\n", argv[4]);
        return 1;
      }
      std::printf("%s: format version %u, %zu bytes\n", argv[4], version, bytes.size());
    } catch (const std::exception& error) {
      std::fprintf(stderr, "error: %s\n", error.what());
      return 1;
    }
    return 0;
  }
  if (argc < 2 || argc > 4) {
    std::fprintf(stderr,
                 "usage: %s SNAPSHOT [DECODE_THREADS [ANALYSIS_THREADS]]\n"
                 "       %s --rewrite 5|6 SNAPSHOT OUT\n"
                 "       %s --one-core SNAPSHOT\n"
                 "  make one with: cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o "
                 "/tmp/s3m.bin\n",
                 argv[0], argv[0], argv[0]);
    return 2;
  }
  const char* path = argv[1];
  try {
    // Memory first, from a parent that holds nothing yet.
    const long streaming_kib = child_max_rss_kib("/proc/self/exe", "streaming", path);
    const long ahead_kib = child_max_rss_kib("/proc/self/exe", "ahead", path);
    const long loading_kib = child_max_rss_kib("/proc/self/exe", "load", path);

    analyzer::FileEvents probe(path);
    const double events = static_cast<double>(probe.event_count());
    std::printf("file: %s, %.0f events in %zu blocks, format version %u, streamed: %s\n", path, events,
                probe.block_count(), probe.head().header.format_version, probe.streaming() ? "yes" : "no");

    const double streaming = seconds_best_of_3([&] { streaming_run(path); });
    const unsigned helpers = argc > 2 ? static_cast<unsigned>(std::atoi(argv[2]))
                                      : analyzer::FileEvents::default_decode_threads();
    const double prefetched = seconds_best_of_3([&] { streaming_run(path, helpers); });
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const unsigned ranges = argc > 3 ? static_cast<unsigned>(std::atoi(argv[3])) : cores;
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
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  return 0;
}
