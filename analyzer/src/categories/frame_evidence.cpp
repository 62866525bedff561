// Frame rules of the categories (docs/GLOSSARY.md, "categories"). Each stack
// is read once: a stacks='all' stack has ~45 frames, most of them PyTorch's.
#include "categories/frame_evidence.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <string_view>

namespace cachealloc::analyzer::categories {

namespace {

std::string_view text_of(const snapshot::Snapshot& head, snapshot::StringId id) {
  return id.value < head.strings.size() ? std::string_view(head.strings[id.value]) : std::string_view();
}

// "void at::cuda::getCUDABlasLtWorkspace()" -> "at::cuda::getCUDABlasLtWorkspace".
std::string_view qualified_name(std::string_view function) {
  const auto space = function.find(' ');
  const auto open = function.find_first_of("(<");
  if (space != std::string_view::npos && (open == std::string_view::npos || space < open))
    function = function.substr(space + 1);
  return function.substr(0, function.find('('));
}

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

bool one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Phases by precedence: the autograd engine running inside an optimizer's
// closure (LBFGS) is a backward pass; an optimizer never runs inside one.
int rank(Phase phase) {
  switch (phase) {
    case Phase::none: return 0;
    case Phase::user: return 1;
    case Phase::forward: return 2;
    case Phase::init: return 3;
    case Phase::optimizer_step: return 4;
    case Phase::zero_grad: return 5;
    case Phase::backward: return 6;
  }
  return 0;
}

void raise(FrameEvidence& evidence, Phase phase) {
  if (rank(phase) > rank(evidence.phase)) evidence.phase = phase;
}

void read_python(FrameEvidence& e, std::string_view file, std::string_view function) {
  e.has_python = true;
  if (contains(file, "torch/nn/modules/module.py") &&
      one_of(function, {"_apply", "convert", "to", "cuda", "to_empty", "_load_from_state_dict", "load_state_dict",
                        "register_parameter"})) {
    e.parameter = true;
    raise(e, Phase::init);
  } else if (file.ends_with("torch/nn/init.py") || one_of(function, {"reset_parameters", "_reset_parameters"}) ||
             (contains(file, "torch/nn/modules/rnn.py") && one_of(function, {"flatten_parameters", "_init_flat_weights"}))) {
    e.parameter = true;
    raise(e, Phase::init);
  } else if (contains(file, "/torch/optim/")) {
    if (function == "zero_grad") {
      raise(e, Phase::zero_grad);
    } else {
      if (function == "_init_group") e.optimizer_state = true;
      raise(e, Phase::optimizer_step);
    }
  } else if ((file.ends_with("torch/autograd/__init__.py") && one_of(function, {"backward", "grad", "_make_grads"})) ||
             (file.ends_with("torch/autograd/graph.py") && function == "_engine_run_backward") ||
             (file.ends_with("torch/_tensor.py") && function == "backward")) {
    raise(e, Phase::backward);
  } else if (contains(file, "torch/nn/modules/") || file.ends_with("torch/nn/functional.py") || function == "forward") {
    raise(e, Phase::forward);
  } else {
    raise(e, Phase::user);
  }
}

void read_native(FrameEvidence& e, std::string_view function, std::string_view module) {
  const std::string_view name = qualified_name(function);
  const std::string low = lower(name);
  if (contains(low, "workspace") || contains(low, "getcurrentcudablashandle") ||
      contains(low, "getcurrentcudablaslthandle") || low.ends_with("run_conv_plan") || low.starts_with("nccl") ||
      contains(lower(module), "libnccl")) {
    e.workspace = true;
  }
  if (name.starts_with("torch::autograd::")) {
    if (contains(name, "AccumulateGrad")) e.accumulate_grad = true;
    // The engine's loop, a node's apply (AddmmBackward0::apply), or the
    // Python binding that calls into the engine; not VariableType's kernels,
    // which run in the forward pass.
    if (name.starts_with("torch::autograd::Engine::") || contains(name, "PythonEngine::") ||
        (name.ends_with("::apply") && (contains(name, "Backward") || contains(name, "AccumulateGrad"))))
      raise(e, Phase::backward);
  } else if (name.starts_with("torch::optim::")) {
    raise(e, Phase::optimizer_step);
  }
}

}  // namespace

FrameEvidenceCache::FrameEvidenceCache(const snapshot::Snapshot& head)
    : head_(head), evidence_(head.stacks.size()), known_(head.stacks.size(), 0) {}

const FrameEvidence& FrameEvidenceCache::first_of(snapshot::StackId stack) {
  static const FrameEvidence kNone{};
  if (stack.value >= evidence_.size()) return kNone;
  evidence_[stack.value] = read(stack);
  known_[stack.value] = 1;
  return evidence_[stack.value];
}

FrameEvidence FrameEvidenceCache::read(snapshot::StackId stack) const {
  FrameEvidence e;
  for (const snapshot::FrameId id : head_.stacks[stack.value].frames) {
    if (id.value == 0 || id.value >= head_.frames.size()) continue;
    const snapshot::Frame& frame = head_.frames[id.value];
    e.has_frames = true;
    const std::string_view file = text_of(head_, frame.file);
    const std::string_view function = text_of(head_, frame.function);
    if (file.ends_with(".py")) read_python(e, file, function);
    else read_native(e, function, text_of(head_, frame.module));
  }
  // Frames of the program that name no phase: its own code between phases.
  if (e.has_frames && e.phase == Phase::none) e.phase = Phase::user;
  return e;
}

}  // namespace cachealloc::analyzer::categories
