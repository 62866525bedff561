// The allocator's free sets (recorder/allocator/src/caching/free_set.hpp): size bins
// with a bitmap, plus a tree for blocks above the bins, checked against a
// std::set in (size, address) order over random inserts, erases, best-fit
// look-ups and walks in both directions. Both pools' bin widths are checked:
// the small pool's 512 B (a bin is one size) and the large pool's 64 KiB (a
// bin holds many sizes, so the request's own bin needs a search).
#include <doctest/doctest.h>

#include <boost/intrusive/set.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "../recorder/allocator/src/caching/free_set.hpp"

namespace {

struct Node {
  std::uintptr_t ptr = 0;
  std::size_t size = 0;
  boost::intrusive::set_member_hook<boost::intrusive::link_mode<boost::intrusive::normal_link>,
                                    boost::intrusive::optimize_size<true>>
      hook;
};
struct BySize {
  bool operator()(const Node& a, const Node& b) const noexcept {
    return a.size != b.size ? a.size < b.size : a.ptr < b.ptr;
  }
};
struct SizeKey {
  bool operator()(std::size_t size, const Node& b) const noexcept { return size < b.size || (size == b.size && 0 < b.ptr); }
  bool operator()(const Node& b, std::size_t size) const noexcept { return b.size < size; }
};
using Tree = boost::intrusive::multiset<Node, boost::intrusive::member_hook<Node, decltype(Node::hook), &Node::hook>,
                                        boost::intrusive::compare<BySize>, boost::intrusive::constant_time_size<false>>;
using Set = cachealloc::BinnedFreeSet<Tree>;
using Key = std::pair<std::size_t, std::uintptr_t>;

// The reference's best fit: the first (size, address) not below (size, 0).
const Node* reference_fit(const std::set<Key>& reference, const std::vector<Node>& nodes, std::size_t size) {
  const auto it = reference.lower_bound({size, 0});
  if (it == reference.end()) return nullptr;
  return &nodes[(it->second - 0x1000) / 512];
}

void check_against_reference(std::size_t bin_width, std::size_t largest, std::uint64_t seed) {
  // Given blocks whose sizes are multiples of 512 B, from 512 B to `largest`
  // (past the last bin, so the tree after the bins is used too), with
  // unique addresses; each size is drawn so that equal sizes recur.
  Set set(bin_width);
  std::set<Key> reference;
  std::vector<Node> nodes(4000);
  for (std::size_t i = 0; i < nodes.size(); ++i) nodes[i].ptr = 0x1000 + i * 512;
  std::vector<bool> inside(nodes.size(), false);
  std::mt19937_64 random(seed);
  auto draw_size = [&] {
    // Log-uniform, on a coarse grid half the time so that sizes repeat.
    const std::size_t units = largest / 512;
    std::size_t u = std::size_t{1} << (random() % (std::bit_width(units)));
    u = std::min(units, u + random() % u);
    if (random() & 1) u = (u + 7) / 8 * 8;
    return std::max<std::size_t>(1, std::min(u, units)) * 512;
  };
  for (int step = 0; step < 60'000; ++step) {
    const std::size_t i = random() % nodes.size();
    // When: a block goes in or out (its size is set while it is out).
    if (inside[i]) {
      set.erase(Set::s_iterator_to(nodes[i]));
      reference.erase({nodes[i].size, nodes[i].ptr});
      inside[i] = false;
    } else {
      nodes[i].size = draw_size();
      set.insert(nodes[i]);
      reference.insert({nodes[i].size, nodes[i].ptr});
      inside[i] = true;
    }
    REQUIRE(set.size() == reference.size());
    // Then best fit agrees for a request of any size, a multiple of 512 or
    // not, below, inside or above the bins.
    for (int probe = 0; probe < 4; ++probe) {
      std::size_t want = random() % 3 == 0 ? draw_size() : random() % (largest + largest / 4) + 1;
      const Node* expected = reference_fit(reference, nodes, want);
      const auto it = set.lower_bound(want, SizeKey{});
      if (expected == nullptr) {
        REQUIRE(it == set.end());
      } else {
        REQUIRE(it != set.end());
        REQUIRE(&*it == expected);
      }
    }
    // And every so often the whole order agrees, forwards and backwards.
    if (step % 5000 == 0) {
      std::vector<Key> forwards;
      for (auto it = set.begin(); it != set.end(); ++it) forwards.emplace_back(it->size, it->ptr);
      REQUIRE(forwards == std::vector<Key>(reference.begin(), reference.end()));
      std::vector<Key> backwards;
      for (auto it = set.end(); it != set.begin();) {
        --it;
        backwards.emplace_back(it->size, it->ptr);
      }
      REQUIRE(backwards == std::vector<Key>(reference.rbegin(), reference.rend()));
    }
  }
  set.clear();
  CHECK(set.empty());
  CHECK(set.begin() == set.end());
}

}  // namespace

TEST_CASE("given the small pool's 512 B bins, best fit and order match a (size, address) set") {
  check_against_reference(512, 4u << 20, 1);
}

TEST_CASE("given the large pool's 64 KiB bins, best fit and order match a (size, address) set") {
  // A bin holds 128 sizes here: the request's own bin often starts with
  // blocks too small for it.
  check_against_reference(64u << 10, 320u << 20, 2);
}

TEST_CASE("given a 64 KiB bin whose first blocks are too small, best fit takes the smallest that fits") {
  // Given three blocks in the bin (64 KiB, 128 KiB]: 72, 96 and 120 KiB.
  Set set(64u << 10);
  std::vector<Node> nodes(3);
  const std::size_t sizes[] = {72u << 10, 96u << 10, 120u << 10};
  for (std::size_t i = 0; i < 3; ++i) {
    nodes[i].ptr = 0x10000 * (3 - i);
    nodes[i].size = sizes[i];
    set.insert(nodes[i]);
  }
  // When 80 KiB is asked for, then 96 KiB is the best fit, not the bin's
  // first block; and past 120 KiB nothing fits.
  CHECK(set.lower_bound(80u << 10, SizeKey{})->size == (96u << 10));
  CHECK(set.lower_bound(72u << 10, SizeKey{})->size == (72u << 10));
  CHECK(set.lower_bound((120u << 10) + 512, SizeKey{}) == set.end());
}
