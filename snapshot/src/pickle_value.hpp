// The value tree of the restricted unpickler (pickle_reader.cpp) that the
// mapper (pickle_mapper.cpp) turns into a Snapshot.
//
// Every node lives in one arena and refers to others by index. That is what
// makes the memo cheap (BINGET pushes an index, never a copy), keeps cycles
// harmless (a list may contain itself; nothing owns anything), and lets the
// tree be destroyed without recursion, however deep it is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cachealloc::snapshot::pickle {

using NodeId = std::uint32_t;

enum class Kind : std::uint8_t { none, boolean, integer, floating, text, bytes, list, tuple, dict };
const char* to_string(Kind kind) noexcept;

// A Python int. Values past 64 bits keep only `too_big`: no field of a
// memory snapshot needs them, but a reader must still parse past them.
struct Integer {
  bool negative = false;
  bool too_big = false;
  std::uint64_t magnitude = 0;
};

struct Node {
  Kind kind = Kind::none;
  bool flag = false;     // boolean
  Integer integer{};     // integer
  double number = 0.0;   // floating
  std::string text;      // text (UTF-8 as stored) and bytes
  // list and tuple: the items; dict: keys and values interleaved, in
  // insertion order (a repeated key: the last one wins, as in Python).
  std::vector<NodeId> items;
};

struct Tree {
  std::vector<Node> nodes;
  NodeId root = 0;
  const Node& operator[](NodeId id) const { return nodes[id]; }
};

// Parses a pickle of protocol 2 to 5. Throws SnapshotError (see pickle.hpp).
Tree parse(std::span<const std::byte> bytes);

// The value of `key` in a dict node, or nullptr when absent.
const NodeId* find(const Tree& tree, const Node& dict, std::string_view key);

}  // namespace cachealloc::snapshot::pickle
