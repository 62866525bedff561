// cachealloc-synthetic: a training-loop workload on the real allocator and a
// simulated device, recorded and dumped as a snapshot; for tests and benchmarks.
// Exit codes: 0 written; 2 bad usage or the file cannot be written; 1 an internal error.
#include <cstdio>
#include <string>
#include <vector>

#include "../common/conventions.hpp"
#include "../common/output.hpp"
#include "workload.hpp"

int main(int argc, char** argv) {
  using namespace cachealloc::cli;
  constexpr const char* kProgram = "cachealloc-synthetic";
  CLI::App app{"Drive the caching allocator with a synthetic training loop until N events are recorded,\n"
               "then dump the memory history. The ring holds the whole run.\n\n"
               "Example:\n"
               "  cachealloc-synthetic --events 1000000 --seed 1 --stacks native -o trace.snap\n"
               "Exit status: 0 written; 2 bad usage or the file cannot be written; 1 an internal error.",
               kProgram};
  cachealloc::synthetic::WorkloadOptions options;
  std::string stacks = "native";
  std::string output;
  bool force = false;
  app.add_option("--events", options.events, "Events to record")
      ->check(whole_number(1, 1'000'000'000))
      ->capture_default_str();
  app.add_option("--seed", options.seed, "Random seed; with --threads 1 the events depend on it alone")
      ->check(whole_number(0, 9'000'000'000'000'000'000))
      ->capture_default_str();
  app.add_option("--stacks", stacks, "Stack capture: none or native")->check(one_of({"none", "native"}))->capture_default_str();
  app.add_option("--threads", options.threads, "Threads running the loop, each on its own streams")
      ->check(whole_number(1, 1024))
      ->capture_default_str();
  app.add_option("-o,--output", output, "Snapshot file to write")->required();
  std::string when_full = "wait";
  app.add_flag("--stream", options.stream,
               "Write -o as a streamed recording while the loop runs (every event kept, in bounded memory)");
  app.add_option("--stream-when-full", when_full,
                 "With --stream, when the disk cannot keep up: wait (the loop slows down) or drop (events are counted)")
      ->check(one_of({"wait", "drop"}))
      ->capture_default_str();
  app.add_flag("--exact-categories", options.exact_categories,
               "Tag the loop's allocations with their categories (category events), with a model's parameters, "
               "gradients and optimizer state kept beside them, so that reports show exact categories");
  app.add_flag("-f,--force", force, "overwrite the -o file if it exists");
  add_version_flags(app, std::string(kProgram) + " " CACHEALLOC_VERSION);
  if (const auto stop = parse(app, kProgram, std::vector<std::string>(argv + 1, argv + argc))) return *stop;
  return run_guarded(kProgram, [&] {
    if (output == "-") throw UsageError("-o -: the snapshot is written to a file (the recorder renames it into place)");
    { const Output check(output, force); }  // refuses an existing file without --force, before the run
    options.stacks = cachealloc::parse_stack_capture(stacks);
    options.stream_when_full = cachealloc::parse_stream_when_full(when_full);
    const auto result = cachealloc::synthetic::run_workload(options, output);
    std::printf("%s: %llu events recorded over %llu steps (%llu OOMs)\n", output.c_str(),
                static_cast<unsigned long long>(result.recorded), static_cast<unsigned long long>(result.steps),
                static_cast<unsigned long long>(result.ooms));
    if (options.stream) {
      std::printf("%s: streamed %llu events in %llu bytes; buffers peaked at %llu bytes; %llu waits for the disk\n",
                  output.c_str(), static_cast<unsigned long long>(result.stream.events_written),
                  static_cast<unsigned long long>(result.stream.bytes_written),
                  static_cast<unsigned long long>(result.stream.peak_buffer_bytes),
                  static_cast<unsigned long long>(result.stream.waits));
      if (result.stream.dropped_events > 0)
        std::fprintf(stderr,
                     "%s: note: %llu events were dropped (--stream-when-full drop); the file's replayed figures are "
                     "approximate, neither exact nor bounds\n",
                     kProgram, static_cast<unsigned long long>(result.stream.dropped_events));
    } else if (result.ring_overflowed) {
      std::fprintf(stderr, "%s: note: the ring overflowed; figures are lower bounds\n", kProgram);
    }
    return kExitOk;
  });
}
