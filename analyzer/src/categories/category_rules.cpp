#include "categories/category_rules.hpp"

namespace cachealloc::analyzer::categories {

Category infer_category(const Lifetime& l) noexcept {
  if (l.private_pool) return Category::cuda_graph_pool;
  const FrameEvidence& e = l.evidence;
  if (e.workspace) return Category::workspace;
  if (e.parameter) return Category::parameter;
  if (e.accumulate_grad) return Category::gradient;
  // Freed in the stretch of the phase that made it: a step's scratch.
  const bool same_stretch = l.known_start && l.freed && l.freed_instance == l.made_instance;
  if (e.optimizer_state && !same_stretch) return Category::optimizer_state;
  const bool freed_by_backward = l.freed && l.freed_in == Phase::backward;
  switch (l.made_in) {
    case Phase::optimizer_step: return same_stretch ? Category::temporary : Category::optimizer_state;
    // Made by the autograd engine and alive after its pass, of a
    // parameter's size: a .grad. (cuBLAS's workspace for the engine's
    // stream lives as long, and has no frame when only Python's were kept.)
    case Phase::backward:
      if (same_stretch) return Category::temporary;
      return l.parameter_sized ? Category::gradient : Category::other;
    case Phase::forward:
      if (same_stretch) return Category::temporary;
      return freed_by_backward ? Category::activation : Category::other;
    case Phase::zero_grad: return same_stretch ? Category::temporary : Category::other;
    // The program's own code, or no frame at all: only the backward pass
    // that freed it says what it was (a tensor saved for that pass).
    case Phase::user:
    case Phase::none: return freed_by_backward ? Category::activation : Category::other;
    case Phase::init: return Category::other;
  }
  return Category::other;
}

}  // namespace cachealloc::analyzer::categories
