// What a stack's frames say about the allocation it made: which phase of a
// training step ran it (forward, backward, optimizer) and what the frames
// alone prove (a parameter's initialization, a library's workspace, an
// optimizer's state, a gradient's accumulation). Private to analyzer/src.
#pragma once

#include <cstdint>
#include <vector>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::analyzer::categories {

// The phase a stack shows; `none` where its frames name none, `user` where
// it has frames of the program but none of a phase (data loading, logging).
enum class Phase : std::uint8_t { none, user, init, forward, backward, optimizer_step, zero_grad };

struct FrameEvidence {
  Phase phase = Phase::none;
  bool parameter = false;        // nn.Module._apply/to/cuda, nn.init, reset_parameters, flatten_parameters
  bool workspace = false;        // cuBLAS/cuBLASLt workspace, cuDNN's plan workspace, NCCL's own memory
  bool optimizer_state = false;  // torch/optim/*.py _init_group: the state tensors' creation
  bool accumulate_grad = false;  // AccumulateGrad: a gradient made or grown into .grad
  bool has_frames = false;
  bool has_python = false;
};

// Evidence per StackId, each stack read once.
class FrameEvidenceCache {
 public:
  explicit FrameEvidenceCache(const snapshot::Snapshot& head);
  // Inline: the walk asks once or twice per allocation, nearly always of a
  // stack read already.
  const FrameEvidence& of(snapshot::StackId stack) {
    if (stack.value < known_.size() && known_[stack.value]) [[likely]]
      return evidence_[stack.value];
    return first_of(stack);
  }

 private:
  const FrameEvidence& first_of(snapshot::StackId stack);
  FrameEvidence read(snapshot::StackId stack) const;
  const snapshot::Snapshot& head_;
  std::vector<FrameEvidence> evidence_;
  std::vector<std::uint8_t> known_;
};

}  // namespace cachealloc::analyzer::categories
