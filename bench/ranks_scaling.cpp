// `ranks` over many files, scaling with threads, results in
// docs/PERFORMANCE.md ("Figures measured once").
//
//   bench_ranks_scaling [--dir DIR] [--files 64] [--events 200000] [--threads 1,2,4,8,16]
//
// Makes --files rank files (rank_0.bin ...) in DIR with the synthetic
// training loop (cli/synthetic, seed = rank + 1, native stacks) unless DIR
// already holds them, then, for each thread count, runs summarize_ranks()
// over all of them three times in a fresh process (fork) and prints the best
// wall time, files/s, events/s, the speed-up over one thread, the child's
// peak RSS (ru_maxrss), which should grow with the threads (one file open
// per thread), not with the number of files, and its CPU time per run (on a
// shared machine, CPU / wall says how many cores it actually got).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "args.hpp"
#include "cachealloc/analyzer/compare.hpp"
#include "cachealloc/snapshot/detail/cores.hpp"
#include "workload.hpp"

using namespace cachealloc;
namespace fs = std::filesystem;

namespace {

struct ChildResult {
  double seconds = 0;
  std::uint64_t events = 0;
  long max_rss_kib = 0;
  double cpu_seconds = 0;  // the child's user + system time over its three runs
  bool ok = false;
};

ChildResult run_child(const std::vector<fs::path>& files, unsigned threads) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    analyzer::RanksOptions options;
    options.threads = threads;
    double best = 1e30;
    std::uint64_t events = 0;
    for (int repeat = 0; repeat < 3; ++repeat) {
      const auto start = std::chrono::steady_clock::now();
      const std::vector<analyzer::RankSummary> ranks = analyzer::summarize_ranks(files, options);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best = std::min(best, seconds);
      events = 0;
      for (const auto& r : ranks) events += r.run.events;
    }
    char line[128];
    const int n = std::snprintf(line, sizeof line, "%.6f %llu\n", best, static_cast<unsigned long long>(events));
    if (::write(pipe_fds[1], line, static_cast<std::size_t>(n)) != n) ::_exit(1);
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  char buffer[128] = {};
  const ssize_t got = ::read(pipe_fds[0], buffer, sizeof buffer - 1);
  ::close(pipe_fds[0]);
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  ChildResult result;
  unsigned long long events = 0;
  result.ok = got > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
              std::sscanf(buffer, "%lf %llu", &result.seconds, &events) == 2;
  result.events = events;
  result.max_rss_kib = usage.ru_maxrss;
  result.cpu_seconds = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                       static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir = fs::temp_directory_path() / "cachealloc-ranks-bench";
  std::size_t count = 64;
  std::uint64_t events = 200'000;
  std::vector<unsigned> threads;
  const bench::Args args(argc, argv, "[--dir DIR] [--files N] [--events N] [--threads 1,2,4]", 8);
  for (int i = 1; args.has(i); i += 2) {
    const std::string option = argv[i];
    if (option != "--dir" && option != "--files" && option != "--events" && option != "--threads")
      args.fail("unknown option '" + option + "'");
    if (!args.has(i + 1)) args.fail(option + " needs a value");
    if (option == "--dir") {
      dir = argv[i + 1];
    } else if (option == "--files") {
      count = args.count<std::size_t>(i + 1, count, 1, 100'000, "--files");
    } else if (option == "--events") {
      events = args.count<std::uint64_t>(i + 1, events, 1, 1'000'000'000, "--events");
    } else if (option == "--threads") {
      std::stringstream list(argv[i + 1]);
      for (std::string item; std::getline(list, item, ',');) {
        const auto n = bench::parse_count(item, 1, 1024);
        if (!n) args.fail("--threads takes counts from 1 to 1024, not '" + item + "'");
        threads.push_back(static_cast<unsigned>(*n));
      }
      if (threads.empty()) args.fail("--threads needs a list such as 1,2,4");
    }
  }
  const unsigned cores = snapshot::detail::usable_cores();
  if (threads.empty()) {
    for (unsigned t = 1; t < cores; t *= 2) threads.push_back(t);
    threads.push_back(cores);
  }
  fs::create_directories(dir);
  std::vector<fs::path> files;
  const auto made = std::chrono::steady_clock::now();
  for (std::size_t r = 0; r < count; ++r) {
    const fs::path path = dir / ("rank_" + std::to_string(r) + ".bin");
    if (!fs::exists(path)) {
      synthetic::WorkloadOptions options;
      options.events = events;
      options.seed = r + 1;
      synthetic::run_workload(options, path);
    }
    files.push_back(path);
  }
  std::uintmax_t bytes = 0;
  for (const fs::path& f : files) bytes += fs::file_size(f);
  std::printf("ranks over %zu files in %s (%.1f MB in all; made or found in %.1f s), %u cores\n", files.size(),
              dir.c_str(), static_cast<double>(bytes) / 1e6,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - made).count(), cores);
  std::printf("%8s %10s %10s %14s %9s %12s %14s\n", "threads", "best s", "files/s", "events/s", "speed-up",
              "peak RSS MB", "CPU s per run");
  double one = 0;
  for (const unsigned t : threads) {
    const ChildResult r = run_child(files, t);
    if (!r.ok) {
      std::printf("%8u failed\n", t);
      return 1;
    }
    if (one == 0) one = r.seconds;
    const double speedup = threads.front() == 1 ? one / r.seconds : 0;
    std::printf("%8u %10.3f %10.1f %14.0f %9.2f %12.1f %14.3f\n", t, r.seconds,
                static_cast<double>(files.size()) / r.seconds, static_cast<double>(r.events) / r.seconds, speedup,
                static_cast<double>(r.max_rss_kib) / 1024.0, r.cpu_seconds / 3.0);
  }
  return 0;
}
