#include "categories/phases.hpp"

#include <algorithm>
#include <cctype>
#include <string>

namespace cachealloc::analyzer::categories {

Phase phase_of_annotation(std::string_view name) {
  std::string low(name);
  std::transform(low.begin(), low.end(), low.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const auto has = [&low](std::string_view part) { return low.find(part) != std::string::npos; };
  // PyTorch's optimizers annotate "Optimizer.step#Adam.step" and
  // "Optimizer.zero_grad#Adam.zero_grad".
  if (has("zero_grad")) return Phase::zero_grad;
  if (has("optimizer") && has("step")) return Phase::optimizer_step;
  if (has("backward")) return Phase::backward;
  if (has("forward")) return Phase::forward;
  return Phase::none;
}

void PhaseTracker::annotation_end(Phase phase) {
  const auto it = std::find(open_.rbegin(), open_.rend(), phase);
  if (it != open_.rend()) open_.erase(std::next(it).base());
  // Leaving a phase an annotation named: what ran next is the program's own
  // code until a frame says otherwise.
  if (phase != Phase::none) frames_ = Phase::user;
  settle();
}

void PhaseTracker::settle() {
  Phase now = frames_;
  for (auto it = open_.rbegin(); it != open_.rend(); ++it) {
    if (*it != Phase::none) {
      now = *it;
      break;
    }
  }
  if (now != current_) {
    current_ = now;
    ++instance_;
  }
}

}  // namespace cachealloc::analyzer::categories
