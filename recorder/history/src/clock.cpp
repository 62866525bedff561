// Reading the clocks of clock.hpp, and probing once whether the TSC can be
// the precise clock.
#include "clock.hpp"

#include <cstdio>
#include <cstring>
#include <ctime>

namespace cachealloc::detail {

namespace {
std::uint64_t clock_ns(clockid_t clock) noexcept {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}
}  // namespace

// CLOCK_MONOTONIC through the vDSO: ~20 ns and no system call, the clock the
// snapshot model names, comparable across processes and with other tools'
// traces, and immune to the TSC calibration and migration questions that an
// rdtsc-based clock would raise for a gain of ~10 ns per event.
std::uint64_t monotonic_ns() noexcept { return clock_ns(CLOCK_MONOTONIC); }

std::uint64_t coarse_ns() noexcept { return clock_ns(CLOCK_MONOTONIC_COARSE); }

bool tsc_is_invariant() noexcept {
  static const bool invariant = [] {
#if defined(__x86_64__)
    std::FILE* cpuinfo = std::fopen("/proc/cpuinfo", "r");
    if (!cpuinfo) return false;
    char line[4096];
    bool constant = false, nonstop = false, rdtscp = false;  // now_ticks() reads it with RDTSCP
    while (std::fgets(line, sizeof(line), cpuinfo)) {
      if (std::strncmp(line, "flags", 5) != 0) continue;
      constant = std::strstr(line, " constant_tsc") != nullptr;
      nonstop = std::strstr(line, " nonstop_tsc") != nullptr;
      rdtscp = std::strstr(line, " rdtscp") != nullptr;
      break;
    }
    std::fclose(cpuinfo);
    return constant && nonstop && rdtscp;
#else
    return false;
#endif
  }();
  return invariant;
}

}  // namespace cachealloc::detail
