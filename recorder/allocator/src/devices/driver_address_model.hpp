// The driver address model: where the CUDA driver places cudaMalloc
// allocations, so that the simulated device hands out the addresses a real
// device would. PyTorch's best fit breaks ties between equal-size cached
// blocks by address, so the address order decides which block is reused, and
// with it every figure that follows.
//
// Measured on an NVIDIA H200, driver 580.159.04, CUDA 13.0, PyTorch 2.11
// (docs/VERIFICATION.md, "The driver address model").
// In MiB, relative to a base B that is 32 MiB aligned:
//
//   - The driver keeps a list of VA chunks, each with its live allocations
//     and its creation order.
//   - Two chunks exist from the start and are never released; they stand for
//     the CUDA context's own allocations: [B, B+32) with [B, B+30) in use,
//     and [B+96, B+128) with [B+96, B+104) in use. The first counts as the
//     newer of the two.
//   - cudaMalloc(S), S rounded up to the allocation granule:
//     1. Visit the chunks newest first. In the first one with a free gap of
//        at least S, take the smallest such gap (ties: the lowest address)
//        and place the allocation at the bottom of the gap.
//     2. Otherwise create a chunk of C = S rounded up to 32 MiB. The VA holes
//        are the free ranges below B-384 (between chunks, and everything
//        below the lowest one). Scan them top-down and take the first hole
//        strictly larger than C (a hole of exactly C is skipped); the chunk
//        takes the top of that hole and the allocation its bottom. The
//        chunk's slack serves later allocations.
//   - cudaFree: a chunk left with no allocations is released, unless it is
//     one of the two context chunks.
//
// The absolute base does not matter, only the layout relative to B. Not
// modelled: sub-allocation of tiny requests, virtual-memory calls
// (cuMemAddressReserve, which expandable segments use) sharing the same
// address space, and devices other than the first.
//
// Thread safety: none; the simulated device holds its lock around every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>

#include "cachealloc/device.hpp"

namespace cachealloc::detail {

// Every constant of the model, in one place, with what it was measured on.
struct DriverAddressConstants {
  static constexpr const char* measured_on = "NVIDIA H200, driver 580.159.04, CUDA 13.0, PyTorch 2.11";
  static constexpr std::size_t kMiB = std::size_t{1} << 20;
  // B is a multiple of this.
  static constexpr std::size_t base_alignment = 32 * kMiB;
  // New chunks are S rounded up to this.
  static constexpr std::size_t chunk_granule = 32 * kMiB;
  // Inside a chunk, an allocation of S takes S rounded up to this.
  static constexpr std::size_t allocation_granule = 2 * kMiB;
  // New chunks are placed only below B minus this.
  static constexpr std::size_t holes_below_base = 384 * kMiB;
  struct ContextChunk {
    std::size_t offset;  // from B
    std::size_t size;
    std::size_t used;    // from the chunk's start: the context's own allocations
  };
  // Oldest first: [B, B+32) counts as the newer.
  static constexpr ContextChunk context_chunks[] = {{96 * kMiB, 32 * kMiB, 8 * kMiB}, {0, 32 * kMiB, 30 * kMiB}};
  // Where the first allocation of a fresh process lands: the top of the
  // newer context chunk's free gap.
  static constexpr std::size_t first_allocation_offset = 30 * kMiB;
  // Not an address rule: kDriverFreeMemoryKept (device.hpp).
  static constexpr std::size_t free_memory_kept = kDriverFreeMemoryKept;
};

class DriverAddressModel {
 public:
  // `base` is B; every chunk lies in [floor, ceiling). Throws
  // InvalidArgument when base is not 32 MiB aligned, or leaves no room for
  // the context chunks below ceiling or for new chunks above floor.
  DriverAddressModel(std::uintptr_t base, std::uintptr_t floor, std::uintptr_t ceiling);

  // The address cudaMalloc(bytes) returns; 0 when no hole can take the
  // chunk it needs (the address space is exhausted). bytes > 0.
  std::uintptr_t allocate(std::size_t bytes);
  // cudaFree(address). Returns false, changing nothing, when address is not
  // a live allocation.
  bool free(std::uintptr_t address);

  std::uintptr_t base() const noexcept { return base_; }
  // Chunks alive now, the two context chunks included.
  std::size_t chunk_count() const noexcept { return chunks_.size(); }

 private:
  struct Chunk {
    std::uintptr_t start = 0;
    std::size_t size = 0;
    std::uint64_t created = 0;
    bool permanent = false;
    std::map<std::uintptr_t, std::size_t> allocations;  // start -> granule-rounded length
    std::size_t largest_gap = 0;                        // lets the newest-first scan skip full chunks
  };

  static std::size_t largest_gap(const Chunk& chunk);
  static std::uintptr_t smallest_gap(const Chunk& chunk, std::size_t bytes);
  Chunk& create_chunk(std::uintptr_t start, std::size_t size, bool permanent);
  void place(Chunk& chunk, std::uintptr_t address, std::size_t bytes);

  std::uintptr_t base_;
  std::uintptr_t floor_;
  std::uint64_t next_created_ = 0;
  std::map<std::uintptr_t, Chunk> chunks_;                       // by start address
  std::map<std::uint64_t, std::uintptr_t> by_creation_;          // creation order -> start
  std::unordered_map<std::uintptr_t, std::uintptr_t> owner_;     // allocation -> its chunk's start
};

}  // namespace cachealloc::detail
