// The mixed workload of docs/PERFORMANCE.md's tables, shared by bench_mixed (ours) and
// bench/torch_peer.cpp (PyTorch's allocator), so that both run the same
// requests in the same order: 256 slots; each step frees one slot's block
// (when it holds one) and allocates a new one in its place. Slots and sizes
// come from std::mt19937 seeded with 1; sizes are log-uniform from 512 B to
// 8 MiB, so small-pool and large-pool requests, splits and merges all occur.
// One pass warms the cache (every segment the run needs is reserved); the
// timed passes then stay on the cached path in steady state.
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace mixed_workload {

struct Step {
  std::uint32_t slot;
  std::size_t bytes;
};

inline constexpr std::size_t kSlots = 256;

inline std::vector<Step> steps(std::size_t count) {
  std::mt19937 random(1);
  std::uniform_int_distribution<std::uint32_t> slot(0, kSlots - 1);
  std::uniform_real_distribution<double> log_size(std::log(512.0), std::log(8.0 * 1024 * 1024));
  std::vector<Step> out(count);
  for (Step& step : out) {
    step.slot = slot(random);
    step.bytes = static_cast<std::size_t>(std::exp(log_size(random)));
  }
  return out;
}

// Runs `passes` timed passes after one warm-up pass; returns ns per step
// (one free plus one allocation) of the best timed pass. Frees every slot at
// the end.
template <typename Allocate, typename Free>
double best_ns_per_step(const std::vector<Step>& plan, int passes, Allocate&& allocate, Free&& free) {
  std::vector<void*> slots(kSlots, nullptr);
  auto pass = [&] {
    for (const Step& step : plan) {
      void*& p = slots[step.slot];
      if (p != nullptr) free(p);
      p = allocate(step.bytes);
    }
  };
  pass();
  double best = 1e300;
  for (int i = 0; i < passes; ++i) {
    const auto start = std::chrono::steady_clock::now();
    pass();
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    if (ns < best) best = ns;
  }
  for (void*& p : slots) {
    if (p != nullptr) free(p);
    p = nullptr;
  }
  return best / static_cast<double>(plan.size());
}

}  // namespace mixed_workload
