#include "devices/driver_address_model.hpp"

#include <limits>

#include "cachealloc/errors.hpp"

namespace cachealloc::detail {
namespace {

using K = DriverAddressConstants;

constexpr std::size_t round_up(std::size_t bytes, std::size_t granule) { return (bytes + granule - 1) / granule * granule; }

}  // namespace

DriverAddressModel::DriverAddressModel(std::uintptr_t base, std::uintptr_t floor, std::uintptr_t ceiling)
    : base_(base), floor_(floor) {
  if (base % K::base_alignment != 0) throw InvalidArgument("driver address model: the base must be 32 MiB aligned");
  if (base < floor || base - floor <= K::holes_below_base + K::chunk_granule)
    throw InvalidArgument("driver address model: the base leaves no room for chunks below it");
  for (const auto& context : K::context_chunks)
    if (base > ceiling || ceiling - base < context.offset + context.size)
      throw InvalidArgument("driver address model: the context chunks do not fit below the ceiling");
  for (const auto& context : K::context_chunks) {
    // The context's own allocations: never freed, so not in owner_.
    Chunk& chunk = create_chunk(base + context.offset, context.size, /*permanent=*/true);
    chunk.allocations[chunk.start] = context.used;
    chunk.largest_gap = largest_gap(chunk);
  }
}

std::uintptr_t DriverAddressModel::allocate(std::size_t bytes) {
  const std::size_t size = round_up(bytes, K::allocation_granule);
  // 1. The newest chunk with room; in it, the smallest gap.
  for (auto it = by_creation_.rbegin(); it != by_creation_.rend(); ++it) {
    Chunk& chunk = chunks_.at(it->second);
    if (chunk.largest_gap < size) continue;
    const std::uintptr_t address = smallest_gap(chunk, size);
    place(chunk, address, size);
    return address;
  }
  // 2. A new chunk at the top of the first hole, scanning down from B-384,
  // that is strictly larger than the chunk.
  const std::size_t chunk_size = round_up(size, K::chunk_granule);
  std::uintptr_t top = base_ - K::holes_below_base;
  for (auto above = chunks_.lower_bound(top);; --above) {
    // The hole between the chunk below `above` (or the floor) and `top`.
    const std::uintptr_t bottom = above == chunks_.begin() ? floor_ : std::prev(above)->second.start + std::prev(above)->second.size;
    if (bottom < top && top - bottom > chunk_size) break;
    if (above == chunks_.begin()) return 0;
    top = std::min(top, std::prev(above)->second.start);
  }
  Chunk& chunk = create_chunk(top - chunk_size, chunk_size, /*permanent=*/false);
  place(chunk, chunk.start, size);
  return chunk.start;
}

bool DriverAddressModel::free(std::uintptr_t address) {
  const auto owner = owner_.find(address);
  if (owner == owner_.end()) return false;
  Chunk& chunk = chunks_.at(owner->second);
  owner_.erase(owner);
  chunk.allocations.erase(address);
  if (chunk.allocations.empty() && !chunk.permanent) {
    by_creation_.erase(chunk.created);
    chunks_.erase(chunk.start);
    return true;
  }
  chunk.largest_gap = largest_gap(chunk);
  return true;
}

std::size_t DriverAddressModel::largest_gap(const Chunk& chunk) {
  std::size_t largest = 0;
  std::uintptr_t cursor = chunk.start;
  for (const auto& [start, length] : chunk.allocations) {
    largest = std::max(largest, start - cursor);
    cursor = start + length;
  }
  return std::max(largest, chunk.start + chunk.size - cursor);
}

std::uintptr_t DriverAddressModel::smallest_gap(const Chunk& chunk, std::size_t bytes) {
  std::uintptr_t best = 0;
  std::size_t best_size = std::numeric_limits<std::size_t>::max();
  std::uintptr_t cursor = chunk.start;
  auto consider = [&](std::uintptr_t gap_start, std::size_t gap_size) {
    // Strictly smaller: of equal gaps the first seen, the lowest, wins.
    if (gap_size >= bytes && gap_size < best_size) {
      best = gap_start;
      best_size = gap_size;
    }
  };
  for (const auto& [start, length] : chunk.allocations) {
    consider(cursor, start - cursor);
    cursor = start + length;
  }
  consider(cursor, chunk.start + chunk.size - cursor);
  return best;
}

DriverAddressModel::Chunk& DriverAddressModel::create_chunk(std::uintptr_t start, std::size_t size, bool permanent) {
  Chunk& chunk = chunks_[start];
  chunk.start = start;
  chunk.size = size;
  chunk.created = next_created_++;
  chunk.permanent = permanent;
  chunk.largest_gap = size;
  by_creation_[chunk.created] = start;
  return chunk;
}

void DriverAddressModel::place(Chunk& chunk, std::uintptr_t address, std::size_t bytes) {
  chunk.allocations[address] = bytes;
  owner_[address] = chunk.start;
  chunk.largest_gap = largest_gap(chunk);
}

}  // namespace cachealloc::detail
