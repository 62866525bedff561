// Sites: the first frame of the user's program (reports.hpp, SiteFilter).
// Each frame is classified once per report; a stack of PyTorch's
// stacks='all' has ~45 frames, most of them PyTorch's own.
#include <array>
#include <cctype>
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

// The sites of stacks whose native frames stop before the user's program.
constexpr std::string_view kInsidePytorch =
    "inside libtorch: no frame of your program; record with stacks='unwind' or python frames";
constexpr std::string_view kInsideCachealloc =
    "inside cachealloc: no frame of your program; record with stacks='unwind'";

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

// A C++ function as a person reads it: no return type, parameters, template
// arguments, cv-qualifier or "+0x1f" offset. "(anonymous namespace)", a
// lambda's "{lambda(int)#1}" and operator() stay part of the name.
// "void at::native::gpu_reduce_kernel<float, ...>(...)" ->
// "at::native::gpu_reduce_kernel".
std::string bare_function(std::string_view function) {
  function = qualified_name(function);
  std::string out;
  int angle = 0;
  for (std::size_t i = 0; i < function.size(); ++i) {
    const char c = function[i];
    const std::string_view rest = function.substr(i);
    if (rest.starts_with("(anonymous namespace)")) {
      if (angle == 0) out += "(anonymous namespace)";
      i += std::string_view("(anonymous namespace)").size() - 1;
      continue;
    }
    const auto is_operator = [&] {
      if (!rest.starts_with("operator")) return false;
      const bool word_start = i == 0 || function[i - 1] == ':' || function[i - 1] == ' ';
      return word_start && (rest.size() == 8 || !(std::isalnum(static_cast<unsigned char>(rest[8])) || rest[8] == '_'));
    };
    if (is_operator()) {
      // operator(), operator<, operator<<, operator->: the symbol is the name.
      const std::size_t symbol = rest.find_first_not_of(" ", 8);
      std::size_t length = 8;
      if (symbol != std::string_view::npos) {
        const std::string_view op = rest.substr(symbol);
        for (const std::string_view known : {"()", "<<=", ">>=", "<<", ">>", "->", "<=", ">=", "<", ">"}) {
          if (op.starts_with(known)) {
            length = symbol + known.size();
            break;
          }
        }
      }
      if (angle == 0) out += rest.substr(0, length);
      i += length - 1;
      continue;
    }
    if (c == '{') {
      // A lambda or an unnamed type, "{lambda(int)#1}": its parameters are
      // its name, kept whole.
      std::size_t end = i;
      for (int depth = 0; end < function.size(); ++end) {
        if (function[end] == '{') ++depth;
        if (function[end] == '}' && --depth == 0) break;
      }
      if (angle == 0) out += function.substr(i, end + 1 - i);
      i = end;
      continue;
    }
    if (c == '<') {
      ++angle;
    } else if (c == '>') {
      if (angle > 0) --angle;
    } else if (angle == 0) {
      if (c == '(' || c == '+' || c == '[') break;  // parameters, an offset, "[clone .cold]"
      out += c;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out.empty() ? std::string(function) : out;
}

// cachealloc's own frames: never a site, even with the filter off.
bool is_own_frame(const snapshot::Snapshot& snapshot, const snapshot::Frame& frame) {
  return text_of(snapshot, frame.function).starts_with("cachealloc::") ||
         base_name(text_of(snapshot, frame.module)).starts_with("libcachealloc");
}

// The PyTorch extension's glue (python/src/): present in every stack our
// recorder takes under torch, whatever the frame walk reached past it.
bool is_torch_bridge_frame(const snapshot::Snapshot& snapshot, const snapshot::Frame& frame) {
  return qualified_name(text_of(snapshot, frame.function)).starts_with("cachealloc::torch_bridge::") ||
         base_name(text_of(snapshot, frame.module)).starts_with("libcachealloc_torch");
}

// PyTorch's native code, by module (libtorch_cpu.so, libtorch_cuda.so,
// libtorch_python.so, libc10.so, libc10_cuda.so) or by namespace.
bool is_pytorch_native_frame(const snapshot::Snapshot& snapshot, const snapshot::Frame& frame) {
  const std::string_view module = base_name(text_of(snapshot, frame.module));
  if (module.starts_with("libtorch") || module.starts_with("libc10") || module.starts_with("libcaffe2")) return true;
  const std::string_view function = qualified_name(text_of(snapshot, frame.function));
  for (const std::string_view prefix : {"at::", "c10::", "torch::", "caffe2::"})
    if (function.starts_with(prefix)) return true;
  return false;
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
  // Our recorder names each native frame's module (dladdr): a frame of
  // PyTorch's libraries, the interpreter or the runtime is theirs whatever
  // its symbol says (CPython's static cfunction_call, pybind11's glue in
  // libtorch_python, the interpreter's main). PyTorch's pickles name none.
  const std::string_view module = base_name(text_of(snapshot, frame.module));
  static constexpr std::array<std::string_view, 16> kModules = {
      "libtorch", "libc10",    "libcaffe2", "libpython", "python",   "libc.so",    "libm.so",   "ld-linux",
      "libcudnn", "libcublas", "libcuda",   "libnccl",   "libstdc++", "libgcc_s", "libcachealloc", "libnvrtc"};
  for (const std::string_view prefix : kModules)
    if (module.starts_with(prefix)) return true;
  if (function.empty()) return false;  // unresolved, in a module of the user's
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

// A frame of the autograd engine's own loop: the stack ran on its thread.
bool is_autograd_engine(const snapshot::Snapshot& snapshot, const snapshot::Frame& frame) {
  return qualified_name(text_of(snapshot, frame.function)).starts_with("torch::autograd::Engine::");
}

// The op of an at::_ops::NAME::call frame without its overload, as torch.ops
// spells it: sum_dim_IntList -> sum, add_Tensor -> add, mm_out -> mm. PyTorch
// joins op and overload with '_'; an overload that starts with a capital
// (Tensor, Scalar, IntList) marks the cut, and the few lowercase words that
// open an overload (dim, out, int) go with it.
std::string op_name(const snapshot::Snapshot& snapshot, const snapshot::Frame& frame) {
  std::string name = bare_function(text_of(snapshot, frame.function));
  constexpr std::string_view kNamespace = "at::_ops::", kCall = "::call";
  if (!name.starts_with(kNamespace) || !name.ends_with(kCall) || name.size() <= kNamespace.size() + kCall.size())
    return name;
  name = name.substr(kNamespace.size(), name.size() - kNamespace.size() - kCall.size());
  for (std::size_t i = 1; i + 1 < name.size(); ++i) {
    if (name[i] == '_' && std::isupper(static_cast<unsigned char>(name[i + 1]))) {
      name.resize(i);
      break;
    }
  }
  for (const std::string_view overload : {"_dim", "_out", "_int", "_names", "_memory_format"}) {
    if (name.size() > overload.size() && std::string_view(name).ends_with(overload)) {
      name.resize(name.size() - overload.size());
      break;
    }
  }
  return name;
}

// Tensor factories: every op allocates through one, so they never say which op it was.
bool is_factory_op(std::string_view op) {
  return op.starts_with("empty") || op.starts_with("_empty") || op.starts_with("new_empty");
}

// Whether `op` is the one the node is named after (ConvolutionBackward0 runs
// convolution_backward): the node alone then says it all.
bool is_nodes_own_op(std::string_view node, std::string_view op) {
  const auto letters = [](std::string_view text) {
    std::string out;
    for (const char c : text)
      if (c != '_') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    while (!out.empty() && std::isdigit(static_cast<unsigned char>(out.back()))) out.pop_back();
    return out;
  };
  return letters(node) == letters(op);
}

// The node's class: torch::autograd::generated::AddmmBackward0::apply -> AddmmBackward0.
std::string node_name(const snapshot::Snapshot& snapshot, const snapshot::Frame& frame) {
  std::string name = bare_function(text_of(snapshot, frame.function));
  if (name.ends_with("::apply")) name.resize(name.size() - std::string_view("::apply").size());
  const auto colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

// "function (file:line)" with the C++ function bare (bare_function) and no
// file where the symbolizer found none ("??"): a site is read, not linked.
std::string site_text(const snapshot::Snapshot& snapshot, snapshot::FrameId id) {
  if (id.value >= snapshot.frames.size()) return frame_text(snapshot, id);
  const snapshot::Frame& frame = snapshot.frames[id.value];
  const std::string_view function = text_of(snapshot, frame.function);
  const std::string_view file = text_of(snapshot, frame.file);
  if (function.empty() || is_python_file(file)) return frame_text(snapshot, id);
  std::string text = bare_function(function);
  if (!file.empty() && file != "??") {
    text += " (";
    text += file;
    if (frame.line != 0) {
      text += ':';
      text += std::to_string(frame.line);
    }
    text += ')';
  }
  return text;
}

bool is_cpp_frame(const snapshot::Snapshot& snapshot, const snapshot::Frame& frame) {
  const std::string_view file = text_of(snapshot, frame.file);
  return !is_python_file(file) && !file.starts_with("<frozen") && !file.starts_with("<");
}

}  // namespace

struct SiteNamer::State {
  const snapshot::Snapshot& snapshot;
  SiteFilter filter;
  std::vector<std::regex> drop;
  std::vector<std::int8_t> user;  // per FrameId: -1 unknown, 0 no, 1 yes
  std::vector<std::uint32_t> representative;  // per StackId: 0 not yet known
  std::map<std::vector<std::string>, std::uint32_t> by_path;  // printed frames -> first StackId
  // Stack 0 (no frame) in a recording of Python frames only: the autograd
  // engine's thread, which runs no Python (see frameless_site).
  bool python_frames_only = false;
  bool named_frameless_backward = false;
  bool recorded_by_us = false;  // our recorder's settings: a C or C++ program's own threads may run no Python
  bool named_unknown = false;
  bool named_inside_pytorch = false;
  std::string remember(std::string name) {
    if (name == kInsidePytorch) named_inside_pytorch = true;
    return name;
  }
};

SiteNamer::SiteNamer(const snapshot::Snapshot& snapshot, const SiteFilter& filter)
    : state_(std::make_unique<State>(State{snapshot, filter, {}, {}, {}, {}})) {
  for (const std::string& pattern : filter.drop) state_->drop.emplace_back(pattern, std::regex::ECMAScript);
  state_->user.assign(snapshot.frames.size(), -1);
  bool python = false, cpp = false;
  for (std::size_t f = 1; f < snapshot.frames.size(); ++f) {
    const snapshot::Frame& frame = snapshot.frames[f];
    if (is_python_file(text_of(snapshot, frame.file))) python = true;
    else if (frame.function || frame.ip != 0) cpp = cpp || is_cpp_frame(snapshot, frame);
  }
  state_->python_frames_only = python && !cpp;
  state_->recorded_by_us = snapshot.settings.count("history.stacks") != 0;
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

// Where a stack's site stands: `frame`, its index in the stack, and the
// text it prints, either that frame's or a name made from the stack
// (an autograd node, an op, a workspace).
struct SiteChoice {
  std::size_t frame = 0;
  std::string name;
};

// A stack with no frame of the user's and nothing to name it by: its first
// frame past the allocators'. Our recorder's native frames stop where the
// frame-pointer walk leaves our code (stacks='native' under torch: at
// PyTorch's first frame, built without frame pointers); such a stack says so
// instead of naming PyTorch's innermost frame, or ours, as the site.
SiteChoice past_allocator_site(const snapshot::Snapshot& snapshot, const snapshot::Stack& stack) {
  const auto frame_at = [&](std::size_t i) -> const snapshot::Frame* {
    const snapshot::FrameId id = stack.frames[i];
    return id.value < snapshot.frames.size() ? &snapshot.frames[id.value] : nullptr;
  };
  std::size_t first = stack.frames.size();
  bool under_torch = false;
  for (std::size_t i = 0; i < stack.frames.size(); ++i) {
    const snapshot::Frame* frame = frame_at(i);
    if (!frame) continue;
    under_torch = under_torch || is_torch_bridge_frame(snapshot, *frame);
    if (first == stack.frames.size() && !is_allocator_frame(snapshot, *frame)) first = i;
  }
  if (snapshot.header.source == "pytorch-pickle") {
    // PyTorch's own unwinder reaches the interpreter; its stacks never stop early.
    return first != stack.frames.size() ? SiteChoice{first, site_text(snapshot, stack.frames[first])}
                                        : SiteChoice{0, site_text(snapshot, stack.frames[0])};
  }
  bool inside_pytorch = first != stack.frames.size() || under_torch;
  for (std::size_t i = first; i < stack.frames.size() && inside_pytorch; ++i) {
    const snapshot::Frame* frame = frame_at(i);
    inside_pytorch = frame && (is_pytorch_native_frame(snapshot, *frame) || is_own_frame(snapshot, *frame));
  }
  const std::size_t last = stack.frames.size() - 1;
  if (inside_pytorch) return {last, std::string(kInsidePytorch)};
  if (first == stack.frames.size()) return {last, std::string(kInsideCachealloc)};
  return {first, site_text(snapshot, stack.frames[first])};
}

// A stack with no frame of the user's: most often the autograd engine's
// thread in a backward pass. A library workspace (cuBLAS's, held as long as
// its handle) names itself; else the node the engine ran (AddmmBackward0,
// as grad_fn names it) says which forward op the memory is for, and the
// innermost ATen op under it which part of the node's work allocated
// (ConvolutionBackward0's bias gradient is a sum). Without a node, the
// outermost ATen op the thread called (the engine's own sum_to of a
// gradient, say): the op asked for, not the empty() inside it. The first
// frame past the allocator's would be at::detail::empty_generic for nearly
// all, which no one can act on.
SiteChoice framework_site(const snapshot::Snapshot& snapshot, const snapshot::Stack& stack) {
  const auto frame_at = [&](std::size_t i) -> const snapshot::Frame* {
    const snapshot::FrameId id = stack.frames[i];
    return id.value < snapshot.frames.size() ? &snapshot.frames[id.value] : nullptr;
  };
  for (std::size_t i = 0; i < stack.frames.size(); ++i) {
    const snapshot::Frame* frame = frame_at(i);
    if (frame && is_workspace(snapshot, *frame)) {
      const std::string function = bare_function(text_of(snapshot, frame->function));
      const std::string_view raw = text_of(snapshot, frame->function);
      const bool cublas = raw.find("cublas") != std::string_view::npos || raw.find("Blas") != std::string_view::npos;
      return {i, std::string(cublas ? "cuBLAS workspace (" : "workspace (") + function + ")"};
    }
  }
  std::size_t node = stack.frames.size();
  bool engine = false;
  for (std::size_t i = 0; i < stack.frames.size(); ++i) {
    const snapshot::Frame* frame = frame_at(i);
    if (!frame) continue;
    if (node == stack.frames.size() && is_autograd_node(snapshot, *frame)) node = i;
    engine = engine || is_autograd_engine(snapshot, *frame);
  }
  if (node != stack.frames.size()) {
    const std::string node_class = node_name(snapshot, *frame_at(node));
    std::string name = "backward: " + node_class;
    for (std::size_t i = 0; i < node; ++i) {
      const snapshot::Frame* frame = frame_at(i);
      if (!frame || !is_aten_op_call(snapshot, *frame)) continue;
      const std::string op = op_name(snapshot, *frame);
      if (is_factory_op(op)) continue;
      if (!is_nodes_own_op(node_class, op)) name += ", " + op + " (aten)";
      break;
    }
    return {node, name};
  }
  for (std::size_t i = stack.frames.size(); i-- > 0;) {
    const snapshot::Frame* frame = frame_at(i);
    if (!frame || !is_aten_op_call(snapshot, *frame)) continue;
    const std::string op = op_name(snapshot, *frame);
    if (is_factory_op(op)) continue;
    return {i, (engine ? "backward: " : "") + op + " (aten)"};
  }
  return past_allocator_site(snapshot, stack);
}

// The site of `stack`: the user's first frame, Python first; with
// all_frames, the first frame that is not cachealloc's, as recorded.
template <class IsUser>
SiteChoice choose_site(const snapshot::Snapshot& snapshot, const snapshot::Stack& stack, bool all_frames,
                       IsUser&& is_user) {
  std::size_t first_user = stack.frames.size();
  for (std::size_t i = 0; i < stack.frames.size(); ++i) {
    const snapshot::FrameId id = stack.frames[i];
    if (id.value >= snapshot.frames.size()) continue;
    const snapshot::Frame& frame = snapshot.frames[id.value];
    if (all_frames) {
      if (!is_own_frame(snapshot, frame)) return {i, frame_text(snapshot, id)};
      continue;
    }
    if (!is_user(id)) continue;
    if (is_python_file(text_of(snapshot, frame.file))) return {i, frame_text(snapshot, id)};  // the user's Python first
    if (first_user == stack.frames.size()) first_user = i;
  }
  if (all_frames) return past_allocator_site(snapshot, stack);  // our frames only: never a site
  if (first_user != stack.frames.size()) return {first_user, site_text(snapshot, stack.frames[first_user])};
  return framework_site(snapshot, stack);
}

constexpr std::string_view kUnknownSite = "<unknown site>";
constexpr std::string_view kFramelessBackward = "backward pass (no Python frame)";
constexpr std::string_view kFramelessThread = "a thread with no Python frame";

}  // namespace

// Stack 0 has no frame. In PyTorch's recording of Python frames
// (stacks='python'), the thread that ran no Python is the autograd engine's:
// the program's own threads all run Python, and the engine's device threads
// are where PyTorch allocates without it (gradients, DDP's buckets). Our
// recorder's Python frames may come from any program, whose native threads
// run no Python either: there it is only a thread with no Python frame.
std::string SiteNamer::frameless_site() {
  State& s = *state_;
  if (s.python_frames_only && s.recorded_by_us) return s.remember(std::string(kFramelessThread));
  if (s.python_frames_only) {
    s.named_frameless_backward = true;
    return std::string(kFramelessBackward);
  }
  s.named_unknown = true;
  return std::string(kUnknownSite);
}

std::string SiteNamer::site(snapshot::StackId id) {
  const snapshot::Snapshot& snapshot = state_->snapshot;
  if (id.value >= snapshot.stacks.size()) return std::string(kUnknownSite);
  const snapshot::Stack& stack = snapshot.stacks[id.value];
  if (stack.frames.empty()) return frameless_site();
  return state_->remember(
      choose_site(snapshot, stack, state_->filter.all_frames, [this](snapshot::FrameId f) { return is_user_frame(f); })
          .name);
}

std::vector<std::string> SiteNamer::lines(snapshot::StackId id) {
  const snapshot::Snapshot& snapshot = state_->snapshot;
  if (id.value >= snapshot.stacks.size()) return {std::string(kUnknownSite)};
  const snapshot::Stack& stack = snapshot.stacks[id.value];
  if (stack.frames.empty()) return {frameless_site()};
  const bool all_frames = state_->filter.all_frames;
  SiteChoice at = choose_site(snapshot, stack, all_frames, [this](snapshot::FrameId f) { return is_user_frame(f); });
  const std::size_t limit = state_->filter.frames == 0 ? stack.frames.size() : state_->filter.frames;
  std::vector<std::string> out{state_->remember(std::move(at.name))};
  for (std::size_t i = at.frame + 1; i < stack.frames.size() && out.size() < limit; ++i) {
    if (!is_user_frame(stack.frames[i])) continue;
    out.push_back(all_frames ? frame_text(snapshot, stack.frames[i]) : site_text(snapshot, stack.frames[i]));
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
    SiteChoice at = choose_site(snapshot, stack, false, [this](snapshot::FrameId f) { return is_user_frame(f); });
    path.push_back(std::move(at.name));
    for (std::size_t i = at.frame + 1; i < stack.frames.size(); ++i)
      if (is_user_frame(stack.frames[i])) path.push_back(site_text(snapshot, stack.frames[i]));
  }
  known = st.by_path.emplace(std::move(path), id.value).first->second;
  return snapshot::StackId{known};
}

std::vector<std::string> SiteNamer::notes() const {
  const State& s = *state_;
  std::vector<std::string> out;
  if (s.named_frameless_backward)
    out.push_back(std::string(kFramelessBackward) +
                  ": allocations of the autograd engine's thread, which runs no Python; to name each by its "
                  "autograd node and op, record C++ frames too: "
                  "torch.cuda.memory._record_memory_history(stacks='all')");
  if (s.named_unknown)
    out.push_back(std::string(kUnknownSite) + ": the recording holds no stack for these allocations" +
                  (s.snapshot.header.source == "pytorch-pickle"
                       ? " (PyTorch: _record_memory_history(context='all' or 'alloc'), not context=None)"
                       : ""));
  if (s.named_inside_pytorch)
    out.push_back(std::string(kInsidePytorch.substr(0, kInsidePytorch.find(';'))) +
                  ": our recorder's native frames stop at PyTorch's first frame (frame pointers: "
                  "cachealloc.record(stacks='native'), or torch's _record_memory_history alone); "
                  "cachealloc.record(stacks='unwind') unwinds through PyTorch's libraries to its ATen ops, and "
                  "cachealloc.dump('run.pickle') keeps PyTorch's Python frames");
  return out;
}

std::string top_frame(const snapshot::Snapshot& snapshot, snapshot::StackId stack) {
  return SiteNamer(snapshot, SiteFilter{}).site(stack);
}

std::vector<std::string> stack_lines(const snapshot::Snapshot& snapshot, snapshot::StackId stack) {
  return SiteNamer(snapshot, SiteFilter{}).lines(stack);
}

}  // namespace cachealloc::analyzer
