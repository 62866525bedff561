// The rules that turn what the trace shows about one allocation into its
// category (docs/GLOSSARY.md, "categories"). Private to analyzer/src.
#pragma once

#include <cstdint>

#include "cachealloc/analyzer/categories.hpp"
#include "categories/frame_evidence.hpp"

namespace cachealloc::analyzer::categories {

// What the walk learnt about one allocation.
struct Lifetime {
  FrameEvidence evidence;        // its alloc's frames
  Phase made_in = Phase::none;   // the phase its alloc ran in
  std::uint64_t made_instance = 0;
  bool known_start = true;       // false: alive before the ring, made in an unknown stretch
  bool freed = false;
  Phase freed_in = Phase::none;
  std::uint64_t freed_instance = 0;
  bool private_pool = false;     // served from a private pool (a CUDA graph's capture)
  // Its size is that of a parameter the frames showed being made, or the
  // trace showed none: a gradient has its parameter's shape.
  bool parameter_sized = true;
};

// Frames first (they prove what they say), then the phase that made it and
// the one that freed it. Never a guess where neither says anything: other.
Category infer_category(const Lifetime& lifetime) noexcept;

}  // namespace cachealloc::analyzer::categories
