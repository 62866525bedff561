// The synthetic training-loop workload behind cachealloc-synthetic.
#pragma once

#include <cstdint>
#include <filesystem>

#include "cachealloc/history.hpp"

namespace cachealloc::synthetic {

struct WorkloadOptions {
  std::uint64_t events = 100'000;  // stop once this many events are recorded
  std::uint64_t seed = 1;
  StackCapture stacks = StackCapture::native;
  unsigned threads = 1;
  // Write `output` as a streamed recording (format version 7) while the
  // loop runs, instead of dumping the ring at the end: every event is kept,
  // in bounded memory, whatever `events`.
  bool stream = false;
  StreamWhenFull stream_when_full = StreamWhenFull::wait;
  // Tag what the loop knows its allocations are (category events), as the
  // torch extension does, with a model's state beside the loop's own
  // allocations: kExactParameters parameters of parameter_bytes(i) made
  // before the first step and kept, one gradient of the same size per
  // parameter made in the first backward and kept, and two optimizer states
  // (Adam's moments) of that size per parameter made in the first optimizer
  // step and kept. The loop's activations (each layer's output), its
  // per-layer gradients and its per-step optimizer buffers are tagged too.
  // The random draws are those of a run without it.
  bool exact_categories = false;
};

// The model's parameters under WorkloadOptions::exact_categories: sizes
// that are no multiple of 512, so that requested and block bytes differ.
inline constexpr int kExactParameters = 8;
inline constexpr std::uint64_t parameter_bytes(int i) {
  return (static_cast<std::uint64_t>(i) + 1) * 1024 * 1024 + 1000 * static_cast<std::uint64_t>(i) + 4;
}

struct WorkloadResult {
  std::uint64_t recorded = 0;  // events appended, annotations included
  std::uint64_t steps = 0;
  std::uint64_t ooms = 0;
  bool ring_overflowed = false;  // events were lost: the file's figures are lower bounds
  StreamStatus stream;           // with WorkloadOptions::stream
};

// Drives a real CachingAllocator on a simulated H200 with history recording
// (a ring with room for the whole run: `events` and the tail of the last
// step), then dumps to `output`. Phases like a training
// loop ("step N" > "forward" / "backward" / "optimizer" annotations), sizes
// from 512 B to 96 MiB, a copy stream whose input batches are handed to the
// compute stream with record_stream, an occasional empty_cache, and an OOM
// under a memory-fraction cap now and then. With threads == 1 the recorded
// events (all but times and stack addresses) are a function of the seed.
// Throws on a failed dump or a bad option.
WorkloadResult run_workload(const WorkloadOptions& options, const std::filesystem::path& output);

}  // namespace cachealloc::synthetic
