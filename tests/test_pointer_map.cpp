// The allocator's live-pointer table (recorder/allocator/src/caching/pointer_map.hpp):
// open addressing with backward-shift deletion, checked against
// std::unordered_map over random inserts, finds and takes.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "../recorder/allocator/src/caching/pointer_map.hpp"

namespace {
struct Value {
  int id = 0;
};
}  // namespace

TEST_CASE("given random inserts and takes, the live-pointer table answers as a hash map does") {
  // Given keys that are 512-byte aligned addresses, as blocks are, drawn
  // from a small range so that clusters form, break and re-form.
  cachealloc::detail::PointerMap<Value> table;
  std::unordered_map<std::uintptr_t, Value*> reference;
  std::vector<Value> values(4096);
  for (int i = 0; i < 4096; ++i) values[i].id = i;
  std::mt19937_64 random(7);
  auto key_of = [](std::uint64_t n) { return std::uintptr_t{0x7f0000000000} + (n << 9); };
  for (int step = 0; step < 200'000; ++step) {
    const std::uintptr_t key = key_of(random() % 3000);
    const auto it = reference.find(key);
    // When a key is live, half the time it is taken; else it is inserted.
    if (it != reference.end() && (random() & 1)) {
      REQUIRE(table.take(key) == it->second);
      reference.erase(it);
    } else if (it == reference.end()) {
      Value* value = &values[random() % values.size()];
      table.insert(key, value);
      reference.emplace(key, value);
    }
    // Then every answer agrees: a probe of a key, live or not, and the size.
    const std::uintptr_t probe = key_of(random() % 3000);
    const auto expected = reference.find(probe);
    REQUIRE(table.find(probe) == (expected == reference.end() ? nullptr : expected->second));
    REQUIRE(table.size() == reference.size());
  }
  // And taking every key leaves nothing: no key was lost by a shift.
  for (const auto& [key, value] : reference) REQUIRE(table.take(key) == value);
  CHECK(table.size() == 0);
  CHECK(table.take(key_of(1)) == nullptr);
}
