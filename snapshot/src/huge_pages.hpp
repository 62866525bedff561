// Transparent huge pages for the snapshot library's large arrays: a decoded
// block (65,536 events, 3.5 MiB), a whole file's events, the pickle reader's
// trace arrays. Private to the snapshot library.
//
// An array's first touch costs one page fault per 4 KiB page: 1.6 us on the
// H200 host, about 10 us on the dev VM (bench_page_faults), where loading a
// 3M-event file whole took 0.51 s before the advice and 0.11 s after
// (on a 2-core x86 machine). With MADV_HUGEPAGE given before the
// first touch, the kernel may back each whole 2 MiB page inside the array
// with one page and one fault. A hint: refused, or where huge pages are off,
// nothing changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace cachealloc::snapshot::detail {

inline constexpr std::uintptr_t kHugePage = std::uintptr_t{2} << 20;

// Advises the whole 2 MiB pages inside [data, data + bytes).
inline void advise_huge_pages(const void* data, std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const auto from = (reinterpret_cast<std::uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const auto to = (reinterpret_cast<std::uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  if (data != nullptr && from < to) (void)::madvise(reinterpret_cast<void*>(from), to - from, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

// v.reserve(n), with the advice given to new storage before anything touches it.
template <typename T>
void reserve_with_huge_pages(std::vector<T>& v, std::size_t n) {
  if (n <= v.capacity()) return;
  v.reserve(n);
  advise_huge_pages(v.data(), n * sizeof(T));
}

}  // namespace cachealloc::snapshot::detail
