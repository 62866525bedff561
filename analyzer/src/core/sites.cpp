// Sites: the first frame of the user's program (reports.hpp, SiteFilter).
// Each frame is classified once per report; a stack of PyTorch's
// stacks='all' has ~45 frames, most of them PyTorch's own.
#include <array>
#include <map>
#include <regex>
#include <string_view>

#include "cachealloc/analyzer/reports.hpp"

namespace cachealloc::analyzer {

namespace {

std::string_view text_of(const snapshot::Snapshot& snapshot, snapshot::StringId id) {
  return id.value < snapshot.strings.size() ? std::string_view(snapshot.strings[id.value]) : std::string_view();
}

std::string_view base_name(std::string_view path) {
  const auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

bool is_python_file(std::string_view file) { return file.ends_with(".py"); }

// A demangled name may start with its return type ("void at::cuda::...");
// the qualified name is what the prefixes below are matched against.
std::string_view qualified_name(std::string_view function) {
  const auto space = function.find(' ');
  const auto open = function.find_first_of("(<");
  if (space != std::string_view::npos && (open == std::string_view::npos || space < open)) {
    return function.substr(space + 1);
  }
  return function;
}

// cachealloc's own frames: never a site, even with the filter off.
bool is_own_frame(const snapshot::Snapshot& snapshot, const snapshot::Frame& frame) {
  return text_of(snapshot, frame.function).starts_with("cachealloc::") ||
         base_name(text_of(snapshot, frame.module)).starts_with("libcachealloc");
}

// The allocators' and the stack capture's own frames: never a site unless
// the filter is off. A stack with no frame of the user's (the autograd
// engine's thread in a backward pass) is named by its first frame past these.
bool is_allocator_frame(const snapshot::Snapshot& snapshot, const snapshot::Frame& frame) {
  if (is_own_frame(snapshot, frame)) return true;
  const std::string_view function = qualified_name(text_of(snapshot, frame.function));
  static constexpr std::array<std::string_view, 5> kPrefixes = {
      "torch::unwind", "torch::CapturedTraceback", "c10::cuda::CUDACachingAllocator", "c10::cuda::CUDAAllocator",
      "torch::cuda::(anonymous namespace)::gather_with_cpp"};
  for (const std::string_view prefix : kPrefixes)
    if (function.starts_with(prefix)) return true;
  return false;
}

// Frames of the allocators, the frameworks, the runtime and the interpreter.
bool is_framework_frame(const snapshot::Snapshot& snapshot, const snapshot::Frame& frame) {
  const std::string_view function = qualified_name(text_of(snapshot, frame.function));
  const std::string_view file = text_of(snapshot, frame.file);
  if (is_python_file(file) || file.starts_with("<frozen")) {
    return file.starts_with("<frozen") || file.find("/torch/") != std::string_view::npos ||
           file.starts_with("torch/");
  }
  if (function.empty()) {
    // Unresolved: judged by its module.
    const std::string_view module = base_name(text_of(snapshot, frame.module));
    static constexpr std::array<std::string_view, 8> kModules = {"libtorch", "libc10",   "libpython", "libc.so",
                                                                 "libcudnn", "libcublas", "libstdc++", "libcachealloc"};
    for (const std::string_view prefix : kModules)
      if (module.starts_with(prefix)) return true;
    return false;
  }
  static constexpr std::array<std::string_view, 16> kPrefixes = {
      "cachealloc::", "c10::", "at::",   "torch::", "caffe2::",   "std::",   "__gnu_cxx::", "Py",
      "_Py",          "__libc", "_start", "__clone", "start_thread", "clone", "pthread_",    "cudnn"};
  for (const std::string_view prefix : kPrefixes)
    if (function.starts_with(prefix)) return true;
  return function.find("CapturedTraceback") != std::string_view::npos ||
         function.find("gather_with_cpp") != std::string_view::npos;
}

// An autograd node's apply: torch::autograd::generated::AddmmBackward0::apply,
// torch::autograd::AccumulateGrad::apply, torch::autograd::CppNode<F>::apply.
bool is_autograd_node(const snapshot::Snapshot& snapshot, const snapshot::Frame& frame) {
  const std::string_view function = qualified_name(text_of(snapshot, frame.function));
  constexpr std::string_view kAutograd = "torch::autograd::";
  if (!function.starts_with(kAutograd)) return false;
  const std::string_view name = function.substr(0, function.find('('));
  if (!name.ends_with("::apply")) return false;
  // The engine's and the Python bindings' own apply are not nodes.
  return name.find("Engine") == std::string_view::npos && name.find("python::") == std::string_view::npos &&
         name != "torch::autograd::Node::apply";
}

// A CUDA library's workspace: at::cuda::setWorkspaceForHandle,
// at::cuda::getCUDABlasLtWorkspace.
bool is_workspace(const snapshot::Snapshot& snapshot, const snapshot::Frame& frame) {
  const std::string_view function = qualified_name(text_of(snapshot, frame.function));
  return function.starts_with("at::cuda::") && function.substr(0, function.find('(')).find("Workspace") != std::string_view::npos;
}

// The entry of an ATen op: at::_ops::sum_dim_IntList::call.
bool is_aten_op_call(const snapshot::Snapshot& snapshot, const snapshot::Frame& frame) {
  const std::string_view function = qualified_name(text_of(snapshot, frame.function));
  return function.starts_with("at::_ops::") && function.substr(0, function.find('(')).ends_with("::call");
}

}  // namespace

struct SiteNamer::State {
  const snapshot::Snapshot& snapshot;
  SiteFilter filter;
  std::vector<std::regex> drop;
  std::vector<std::int8_t> user;  // per FrameId: -1 unknown, 0 no, 1 yes
  std::vector<std::uint32_t> representative;  // per StackId: 0 not yet known
  std::map<std::vector<std::string>, std::uint32_t> by_path;  // printed frames -> first StackId
};

SiteNamer::SiteNamer(const snapshot::Snapshot& snapshot, const SiteFilter& filter)
    : state_(std::make_unique<State>(State{snapshot, filter, {}, {}, {}, {}})) {
  for (const std::string& pattern : filter.drop) state_->drop.emplace_back(pattern, std::regex::ECMAScript);
  state_->user.assign(snapshot.frames.size(), -1);
}

SiteNamer::~SiteNamer() = default;

bool SiteNamer::is_user_frame(snapshot::FrameId id) {
  State& s = *state_;
  if (s.filter.all_frames) return true;
  if (id.value >= s.user.size()) return false;
  std::int8_t& known = s.user[id.value];
  if (known < 0) {
    const snapshot::Frame& frame = s.snapshot.frames[id.value];
    bool user = !is_framework_frame(s.snapshot, frame);
    if (user && !s.drop.empty()) {
      const std::string text = frame_text(s.snapshot, id);
      for (const std::regex& pattern : s.drop) {
        if (std::regex_search(text, pattern)) {
          user = false;
          break;
        }
      }
    }
    known = user ? 1 : 0;
  }
  return known == 1;
}

namespace {

// The index of the site frame in `stack`, or of the first frame that is not
// cachealloc's when no frame passes the filter.
template <class IsUser>
std::size_t site_index(const snapshot::Snapshot& snapshot, const snapshot::Stack& stack, bool all_frames,
                       IsUser&& is_user) {
  std::size_t first_user = stack.frames.size();
  for (std::size_t i = 0; i < stack.frames.size(); ++i) {
    const snapshot::FrameId id = stack.frames[i];
    if (id.value >= snapshot.frames.size()) continue;
    const snapshot::Frame& frame = snapshot.frames[id.value];
    if (all_frames) {
      if (!is_own_frame(snapshot, frame)) return i;
      continue;
    }
    if (!is_user(id)) continue;
    if (is_python_file(text_of(snapshot, frame.file))) return i;  // the user's Python comes first
    if (first_user == stack.frames.size()) first_user = i;
  }
  if (first_user != stack.frames.size()) return first_user;
  // No frame of the user's: most often the autograd engine's thread in a
  // backward pass. A library workspace (cuBLAS's, held as long as its handle)
  // names itself; else the node the engine ran (AddmmBackward0, as grad_fn
  // names it) says which forward op the memory is for. The first frame past
  // the allocator's would be at::detail::empty_generic for nearly all.
  // Past those, the outermost ATen op the thread called (the engine's own
  // sum_to of a gradient, say): the op asked for, not the empty() inside it.
  for (auto* named : {&is_workspace, &is_autograd_node}) {
    for (std::size_t i = 0; i < stack.frames.size(); ++i) {
      const snapshot::FrameId id = stack.frames[i];
      if (id.value < snapshot.frames.size() && (*named)(snapshot, snapshot.frames[id.value])) return i;
    }
  }
  for (std::size_t i = stack.frames.size(); i-- > 0;) {
    const snapshot::FrameId id = stack.frames[i];
    if (id.value < snapshot.frames.size() && is_aten_op_call(snapshot, snapshot.frames[id.value])) return i;
  }
  for (std::size_t i = 0; i < stack.frames.size(); ++i) {
    const snapshot::FrameId id = stack.frames[i];
    if (id.value < snapshot.frames.size() && !is_allocator_frame(snapshot, snapshot.frames[id.value])) return i;
  }
  return 0;
}

}  // namespace

std::string SiteNamer::site(snapshot::StackId id) {
  const snapshot::Snapshot& snapshot = state_->snapshot;
  if (id.value == 0 || id.value >= snapshot.stacks.size() || snapshot.stacks[id.value].frames.empty())
    return "<unknown site>";
  const snapshot::Stack& stack = snapshot.stacks[id.value];
  const std::size_t at =
      site_index(snapshot, stack, state_->filter.all_frames, [this](snapshot::FrameId f) { return is_user_frame(f); });
  return frame_text(snapshot, stack.frames[at]);
}

std::vector<std::string> SiteNamer::lines(snapshot::StackId id) {
  const snapshot::Snapshot& snapshot = state_->snapshot;
  if (id.value == 0 || id.value >= snapshot.stacks.size() || snapshot.stacks[id.value].frames.empty())
    return {"<unknown site>"};
  const snapshot::Stack& stack = snapshot.stacks[id.value];
  const std::size_t at =
      site_index(snapshot, stack, state_->filter.all_frames, [this](snapshot::FrameId f) { return is_user_frame(f); });
  const std::size_t limit = state_->filter.frames == 0 ? stack.frames.size() : state_->filter.frames;
  std::vector<std::string> out{frame_text(snapshot, stack.frames[at])};
  for (std::size_t i = at + 1; i < stack.frames.size() && out.size() < limit; ++i) {
    if (is_user_frame(stack.frames[i])) out.push_back(frame_text(snapshot, stack.frames[i]));
  }
  return out;
}

snapshot::StackId SiteNamer::representative(snapshot::StackId id) {
  State& st = *state_;
  const snapshot::Snapshot& snapshot = st.snapshot;
  if (id.value == 0 || id.value >= snapshot.stacks.size() || st.filter.all_frames) return id;
  if (st.representative.empty()) st.representative.assign(snapshot.stacks.size(), 0);
  std::uint32_t& known = st.representative[id.value];
  if (known != 0) return snapshot::StackId{known};
  const snapshot::Stack& stack = snapshot.stacks[id.value];
  // By text, not frame: without debug info two call sites of one function
  // print alike, and to the reader they are one site.
  std::vector<std::string> path;
  if (!stack.frames.empty()) {
    const std::size_t at = site_index(snapshot, stack, false, [this](snapshot::FrameId f) { return is_user_frame(f); });
    path.push_back(frame_text(snapshot, stack.frames[at]));
    for (std::size_t i = at + 1; i < stack.frames.size(); ++i)
      if (is_user_frame(stack.frames[i])) path.push_back(frame_text(snapshot, stack.frames[i]));
  }
  known = st.by_path.emplace(std::move(path), id.value).first->second;
  return snapshot::StackId{known};
}

std::string top_frame(const snapshot::Snapshot& snapshot, snapshot::StackId stack) {
  return SiteNamer(snapshot, SiteFilter{}).site(stack);
}

std::vector<std::string> stack_lines(const snapshot::Snapshot& snapshot, snapshot::StackId stack) {
  return SiteNamer(snapshot, SiteFilter{}).lines(stack);
}

}  // namespace cachealloc::analyzer
