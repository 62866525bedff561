// The phase of a training step the program is in, event by event: from the
// annotations open (Optimizer.step, Optimizer.zero_grad, record_function
// names with "forward" or "backward") where one names a phase, else from
// the frames of the last event that had any. An event without frames (the
// autograd engine's thread when only Python frames were recorded) leaves
// the phase as it was. Private to analyzer/src.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "categories/frame_evidence.hpp"

namespace cachealloc::analyzer::categories {

// The phase an annotation's name gives; Phase::none for a name that gives none.
Phase phase_of_annotation(std::string_view name);

class PhaseTracker {
 public:
  void annotation_begin(Phase phase) { open_.push_back(phase), settle(); }
  // Closes the innermost open annotation of that phase (names are not kept).
  void annotation_end(Phase phase);
  void observe(const FrameEvidence& evidence) {
    if (evidence.phase != Phase::none) frames_ = evidence.phase, settle();
  }
  Phase phase() const noexcept { return current_; }
  // Counts phase changes: two events with the same instance ran in one
  // stretch of one phase.
  std::uint64_t instance() const noexcept { return instance_; }

 private:
  void settle();
  std::vector<Phase> open_;
  Phase frames_ = Phase::none;
  Phase current_ = Phase::none;
  std::uint64_t instance_ = 0;
};

}  // namespace cachealloc::analyzer::categories
