// cachealloc-synthetic: a training-loop workload on the real allocator and a
// simulated device, recorded and dumped as a snapshot; for tests and benchmarks.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "workload.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Drive the caching allocator with a synthetic training loop until N events are recorded,\n"
               "then dump the memory history.\n\n"
               "Example:\n"
               "  cachealloc-synthetic --events 1000000 --seed 1 --stacks native -o trace.snap"};
  cachealloc::synthetic::WorkloadOptions options;
  std::string stacks = "native";
  std::string output;
  app.add_option("--events", options.events, "Events to record")->capture_default_str();
  app.add_option("--seed", options.seed, "Random seed; with --threads 1 the events depend on it alone")
      ->capture_default_str();
  app.add_option("--stacks", stacks, "Stack capture: none or native")->capture_default_str();
  app.add_option("--threads", options.threads, "Threads running the loop, each on its own streams")
      ->capture_default_str();
  app.add_option("-o,--output", output, "Snapshot file to write")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    options.stacks = cachealloc::parse_stack_capture(stacks);
    const auto result = cachealloc::synthetic::run_workload(options, output);
    std::printf("%s: %llu events recorded over %llu steps (%llu OOMs)\n", output.c_str(),
                static_cast<unsigned long long>(result.recorded), static_cast<unsigned long long>(result.steps),
                static_cast<unsigned long long>(result.ooms));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
