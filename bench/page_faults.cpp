// bench_page_faults: what the first touch of fresh memory costs, per 4 KiB
// page, with small pages and with MADV_HUGEPAGE given first: the cost the
// snapshot reader's large buffers pay once each (snapshot/src/huge_pages.hpp,
// docs/PERFORMANCE.md, "What limits the figures").
//
//   bench_page_faults [MiB [rounds]]     (default 256 MiB, 3 rounds)
//
// Each round maps fresh anonymous memory, 2 MiB-aligned, writes one byte per
// 4 KiB page, and unmaps it; best round of each mode.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "args.hpp"

namespace {

double first_touch_ns_per_page(std::size_t bytes, bool huge) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  void* mapping = ::mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  auto* base = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(mapping) + kHuge - 1) & ~(kHuge - 1));
  if (huge) (void)::madvise(base, bytes, MADV_HUGEPAGE);
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t at = 0; at < bytes; at += 4096) static_cast<volatile char*>(base)[at] = 1;
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  ::munmap(mapping, bytes + kHuge);
  return ns / static_cast<double>(bytes / 4096);
}

}  // namespace

int main(int argc, char** argv) {
  const cachealloc::bench::Args args(argc, argv, "[MiB (2 or more)] [rounds]", 2);
  const long mib = args.count<long>(1, 256, 2, 1L << 20, "MiB");
  const int rounds = args.count<int>(2, 3, 1, 1000, "rounds");
  const std::size_t bytes = static_cast<std::size_t>(mib) << 20;
  double small = 1e300, huge = 1e300;
  for (int r = 0; r < rounds; ++r) {
    small = std::min(small, first_touch_ns_per_page(bytes, false));
    huge = std::min(huge, first_touch_ns_per_page(bytes, true));
  }
  std::printf("first touch of %ld MiB, per 4 KiB page, best of %d: small pages %.0f ns, MADV_HUGEPAGE %.0f ns\n",
              mib, rounds, small, huge);
  return 0;
}
