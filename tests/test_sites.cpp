// Sites: the first frame of the user's program, on PyTorch's own stacks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "../analyzer/testing/trace_builder.hpp"

using namespace cachealloc;

namespace {

const std::filesystem::path kCorpus = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch" / "corpus";

// The corpus's user program is make_corpus.py; every other frame is PyTorch's,
// the interpreter's or the C++ runtime's.
bool names_user_code(const std::string& text) { return text.find("make_corpus.py") != std::string::npos; }

bool stack_has_user_frame(const snapshot::Snapshot& snap, snapshot::StackId id) {
  for (const snapshot::FrameId frame : snap.stacks[id.value].frames)
    if (names_user_code(analyzer::frame_text(snap, frame))) return true;
  return false;
}

bool names_allocator(const std::string& text) {
  return text.starts_with("torch::unwind") || text.starts_with("torch::CapturedTraceback") ||
         text.find("CUDACachingAllocator") != std::string::npos || text.find("gather_with_cpp") != std::string::npos;
}

// The site of every row of a report's tables (each row's last cell).
std::vector<std::string> row_sites(const analyzer::Document& document) {
  std::vector<std::string> sites;
  for (const auto& section : document.sections) {
    const auto* table = std::get_if<analyzer::Table>(&section);
    if (!table) continue;
    for (const auto& row : table->rows)
      sites.push_back(std::holds_alternative<std::string>(row.back())
                          ? std::get<std::string>(row.back())
                          : std::get<std::vector<std::string>>(row.back()).front());
  }
  return sites;
}

}  // namespace

TEST_CASE("with stacks='all', every site is a frame of the user's program where the stack has one") {
  // given PyTorch's C++ and Python stacks of a real training run
  const snapshot::Snapshot snap = analyzer::load(kCorpus / "stacks_all.pickle");
  analyzer::SiteNamer names(snap, analyzer::SiteFilter{});
  std::size_t user_sites = 0;
  for (std::uint32_t s = 1; s < snap.stacks.size(); ++s) {
    if (snap.stacks[s].frames.empty()) continue;
    // when each stack is named
    const std::string site = names.site(snapshot::StackId{s});
    CAPTURE(site);
    // then it is the user's frame, or, on a thread with none (autograd's), never the allocator's
    if (stack_has_user_frame(snap, snapshot::StackId{s})) {
      CHECK(names_user_code(site));
      ++user_sites;
    } else {
      CHECK_FALSE(names_allocator(site));
    }
  }
  CHECK(user_sites > 10);
}

const std::filesystem::path kPyTorch = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch";

// The sites top lists, one string per printed line.
std::vector<std::vector<std::string>> top_sites(const snapshot::Snapshot& snap, std::size_t limit) {
  analyzer::ReportOptions options;
  options.limit = limit;
  const analyzer::Document top = analyzer::top_report(snap, options);
  std::vector<std::vector<std::string>> sites;
  for (const auto& row : std::get<analyzer::Table>(top.sections.front()).rows)
    sites.push_back(std::get<std::vector<std::string>>(row.back()));
  return sites;
}

// A C++ signature's parameter list follows its name with no space:
// "apply(std::vector<...>&&)"; a location is " (file:line)", a label "(aten)".
bool has_argument_list(const std::string& text) { return std::regex_search(text, std::regex(R"([\w>]\()")); }

TEST_CASE("on the autograd thread, a site is the backward node and its op, a workspace or the op, never the factory") {
  // Given PyTorch's stacks='all' of a CNN's training steps on the H200: the
  // backward pass runs on the autograd engine's thread, whose stacks have no
  // frame of the user's. Every such allocation's stack passes through
  // at::detail::empty_generic, the first frame past the allocator's.
  const snapshot::Snapshot snap = analyzer::load(kPyTorch / "cnn_train_stacks_all.pickle");
  analyzer::SiteNamer names(snap, analyzer::SiteFilter{});
  std::set<std::string> sites;
  std::size_t without_user = 0;
  std::set<std::uint32_t> allocating;
  for (const snapshot::Event& event : snap.events)
    if (event.kind == snapshot::EventKind::alloc) allocating.insert(event.stack.value);
  for (const std::uint32_t s : allocating) {
    if (s == 0 || s >= snap.stacks.size()) continue;
    bool user = false;
    for (const snapshot::FrameId frame : snap.stacks[s].frames)
      user |= analyzer::frame_text(snap, frame).find("dev_workloads.py") != std::string::npos;
    if (user || snap.stacks[s].frames.empty()) continue;
    ++without_user;
    // When each is named, then it is the node (grad_fn's name) with the op
    // under it, a library's workspace, or the ATen op called: short, with no
    // signature, and never the factory.
    const std::string site = names.site(snapshot::StackId{s});
    CAPTURE(site);
    CHECK(site.find("empty_generic") == std::string::npos);
    CHECK_FALSE(has_argument_list(site));
    CHECK(site.find("??") == std::string::npos);
    CHECK((site.starts_with("backward: ") || site.starts_with("cuBLAS workspace (") || site.ends_with(" (aten)")));
    sites.insert(site);
  }
  REQUIRE(without_user > 5);
  // And the CNN's layers show up by their backward nodes and the ops that allocated.
  CHECK(sites.count("cuBLAS workspace (at::cuda::setWorkspaceForHandle)") == 1);
  CHECK(sites.count("backward: ConvolutionBackward0") == 1);
  CHECK(sites.count("backward: ConvolutionBackward0, sum (aten)") == 1);
  CHECK(sites.count("backward: AddmmBackward0, mm (aten)") == 1);
  CHECK(sites.count("backward: ReluBackward0, threshold_backward (aten)") == 1);
  CHECK(sites.count("backward: MaxPool2DWithIndicesBackward0") == 1);
}

TEST_CASE("top's 20 sites of a stacks='all' training run carry no C++ signature, '(?" "?)' or std::allocator") {
  for (const char* file : {"cnn_train_stacks_all.pickle", "corpus/stacks_all.pickle"}) {
    CAPTURE(file);
    // given the top report of a real training run with C++ and Python frames
    const snapshot::Snapshot snap = analyzer::load(kPyTorch / file);
    // when top lists its sites
    const auto sites = top_sites(snap, 20);
    REQUIRE(sites.size() >= 10);
    // then every printed line is one a person can act on
    std::size_t backward = 0;
    for (const auto& lines : sites) {
      for (const std::string& line : lines) {
        CAPTURE(line);
        CHECK_FALSE(has_argument_list(line));
        CHECK(line.find("(?" "?)") == std::string::npos);
        CHECK(line.find("std::allocator") == std::string::npos);
        CHECK(line.find("torch::autograd::generated::") == std::string::npos);
      }
      backward += lines.front().starts_with("backward: ");
    }
    CHECK(backward >= 5);
  }
}

TEST_CASE("with Python-only stacks, the backward pass is named and the report says how to name its nodes") {
  // Given PyTorch's stacks='python' of a GRU's training steps: the autograd
  // engine's thread runs no Python, so its allocations carry no frame.
  const snapshot::Snapshot snap = analyzer::load(kPyTorch / "gru_python_stacks.pickle");
  // when the peak's sites are listed
  const analyzer::Document peak = analyzer::peak_report(snap, {});
  bool named = false;
  for (const std::string& site : row_sites(peak)) {
    CAPTURE(site);
    // then no site is unknown, and the frameless ones are the backward pass
    CHECK(site != "<unknown site>");
    named |= site == "backward pass (no Python frame)";
  }
  CHECK(named);
  // and a note says how to record the frames that name each node
  const bool explained = std::any_of(peak.notes.begin(), peak.notes.end(), [](const std::string& note) {
    return note.starts_with("backward pass (no Python frame)") &&
           note.find("_record_memory_history(stacks='all')") != std::string::npos;
  });
  CHECK(explained);
}

TEST_CASE("in our recorder's Python frames, a frameless allocation is a thread with no Python frame, not the backward "
          "pass") {
  // Given the same Python-only stacks, as our recorder writes them (its
  // settings): a C or C++ program's own threads run no Python either
  snapshot::Snapshot snap = analyzer::load(kPyTorch / "gru_python_stacks.pickle");
  snap.settings["history.stacks"] = "python";
  // when the peak's sites are listed, then the frameless ones say only that
  const analyzer::Document peak = analyzer::peak_report(snap, {});
  bool thread = false, backward = false;
  for (const std::string& site : row_sites(peak)) {
    thread |= site == "a thread with no Python frame";
    backward |= site == "backward pass (no Python frame)";
  }
  CHECK(thread);
  CHECK(!backward);
}

TEST_CASE("a recording with no stack at all keeps '<unknown site>', with a note on recording them") {
  const snapshot::Snapshot snap = analyzer::load(kPyTorch / "no_context.pickle");
  const analyzer::Document peak = analyzer::peak_report(snap, {});
  const auto table = std::find_if(peak.sections.begin(), peak.sections.end(), [](const analyzer::Section& section) {
    return std::holds_alternative<analyzer::Table>(section) && std::get<analyzer::Table>(section).key == "sites";
  });
  REQUIRE(table != peak.sections.end());
  const auto& sites = std::get<analyzer::Table>(*table);
  REQUIRE(sites.rows.size() == 1);
  CHECK(std::get<std::vector<std::string>>(sites.rows[0].back()).front() == "<unknown site>");
  CHECK(std::any_of(peak.notes.begin(), peak.notes.end(),
                    [](const std::string& note) { return note.starts_with("<unknown site>: the recording holds no stack"); }));
}

TEST_CASE("a C++ site prints bare: no return type, parameters, template arguments or offset") {
  // given frames as a symbolizer writes them
  snapshot::Snapshot snap;
  const auto add_frame = [&](const std::string& function, const std::string& file, std::uint32_t line) {
    snapshot::Frame frame;
    snap.strings.push_back(function);
    frame.function = snapshot::StringId{static_cast<std::uint32_t>(snap.strings.size() - 1)};
    snap.strings.push_back(file);
    frame.file = snapshot::StringId{static_cast<std::uint32_t>(snap.strings.size() - 1)};
    frame.line = line;
    snap.frames.push_back(frame);
    snap.stacks.push_back(snapshot::Stack{{snapshot::FrameId{static_cast<std::uint32_t>(snap.frames.size() - 1)}}});
    return snapshot::StackId{static_cast<std::uint32_t>(snap.stacks.size() - 1)};
  };
  const auto templated = add_frame("void model::gemm<float, 4>(float const*, long) const", "gemm.cu", 12);
  const auto anonymous = add_frame("model::(anonymous namespace)::Layer::operator()(at::Tensor&&)", "??", 0);
  const auto offset = add_frame("model::step+0x1f", "", 0);
  const auto lambda = add_frame("main::{lambda(int)#1}::operator()(int) const", "main.cpp", 40);
  const auto python = add_frame("forward", "model.py", 7);
  // when each is a site
  analyzer::SiteNamer names(snap, analyzer::SiteFilter{});
  // then it reads as a name and a place
  CHECK(names.site(templated) == "model::gemm (gemm.cu:12)");
  CHECK(names.site(anonymous) == "model::(anonymous namespace)::Layer::operator()");
  CHECK(names.site(offset) == "model::step");
  CHECK(names.site(lambda) == "main::{lambda(int)#1}::operator() (main.cpp:40)");
  CHECK(names.site(python) == "forward (model.py:7)");
}

TEST_CASE("top's sites on stacks='all' are user frames, and no site prints torch::unwind") {
  // given the top report of the same run
  const snapshot::Snapshot snap = analyzer::load(kCorpus / "stacks_all.pickle");
  analyzer::ReportOptions options;
  const analyzer::Document top = analyzer::top_report(snap, options);
  const std::string text = [&] {
    std::ostringstream out;
    analyzer::render(top, analyzer::Format::table, out);
    return out.str();
  }();
  // then PyTorch's unwinder never names a site, and the user's code does
  CHECK(text.find("torch::unwind") == std::string::npos);
  CHECK(text.find("make_corpus.py") != std::string::npos);
}

TEST_CASE("--frames limits the frames listed, --all-frames turns the filter off, --filter drops more") {
  const snapshot::Snapshot snap = analyzer::load(kCorpus / "stacks_all.pickle");
  snapshot::StackId deep{};
  for (std::uint32_t s = 1; s < snap.stacks.size() && !deep; ++s)
    if (stack_has_user_frame(snap, snapshot::StackId{s})) deep = snapshot::StackId{s};
  REQUIRE(deep);
  // when the default filter lists the frames
  analyzer::SiteFilter filter;
  filter.frames = 2;
  CHECK(analyzer::SiteNamer(snap, filter).lines(deep).size() == 2);
  filter.frames = 0;
  const std::vector<std::string> all_user = analyzer::SiteNamer(snap, filter).lines(deep);
  for (const std::string& line : all_user) CHECK(names_user_code(line));
  // when the filter is off, the first frame is PyTorch's unwinder and every frame is there
  filter.all_frames = true;
  analyzer::SiteNamer unfiltered(snap, filter);
  CHECK(unfiltered.site(deep).starts_with("torch::unwind"));
  CHECK(unfiltered.lines(deep).size() == snap.stacks[deep.value].frames.size());
  // when the user's own frames are filtered too, the site moves outwards
  analyzer::SiteFilter more;
  more.drop = {"case_stacks_all"};
  const std::string site = analyzer::SiteNamer(snap, more).site(deep);
  CHECK(site.find("case_stacks_all") == std::string::npos);
  // and a bad pattern is refused
  more.drop = {"("};
  CHECK_THROWS_AS(analyzer::SiteNamer(snap, more), std::regex_error);
}

TEST_CASE("cachealloc-synthetic's sites are distinct call sites of its model, and top prints each once") {
  // given a trace of the synthetic training loop with native stacks
  const std::filesystem::path out = std::filesystem::path(CACHEALLOC_BINARY_DIR) / "test_sites_synthetic.bin";
  const std::string command = (std::filesystem::path(CACHEALLOC_BINARY_DIR) / "bin" / "cachealloc-synthetic").string() +
                              " --events 3000 --seed 1 --threads 1 --stacks native -o " + out.string() + " >/dev/null";
  REQUIRE(std::system(command.c_str()) == 0);
  const snapshot::Snapshot snap = analyzer::load(out);
  // when top lists its sites with every frame that passes the filter
  analyzer::ReportOptions options;
  options.sites.frames = 0;
  options.limit = 100;
  const analyzer::Document top = analyzer::top_report(snap, options);
  const auto& table = std::get<analyzer::Table>(top.sections.front());
  // then no two rows print the same stack, and the sites are the model's own functions
  std::set<std::vector<std::string>> stacks;
  std::set<std::string> functions;
  for (const auto& row : table.rows) {
    const auto& lines = std::get<std::vector<std::string>>(row.back());
    CAPTURE(lines.front());
    CHECK(stacks.insert(lines).second);
    // (the model's namespace: file and line need debug info, which a Release build lacks)
    CHECK(lines.front().starts_with("training::"));
    functions.insert(lines.front().substr(0, lines.front().rfind(" (")));  // the function, without its line
  }
  // (data loading, attention, MLP, norm, backward, optimizer)
  CHECK(functions.size() >= 6);
  std::filesystem::remove(out);
}

namespace {

// A native frame as our recorder's symbolizer writes it: the demangled
// function, the source where debug info has it, and the module (dladdr).
struct NativeFrame {
  std::string function, file, module;
};

const std::string kTorchLib = "/venv/lib/python3.11/site-packages/torch/lib/";
const std::string kInsideLibtorch =
    "inside libtorch: no frame of your program; record with stacks='unwind' or python frames";

// Our recorder's frames and the extension's, as a stacks='native' dump under torch has them.
const std::vector<NativeFrame> kOurFrames = {
    {"cachealloc::HistoryRecorder::on_events(cachealloc::AllocatorEventBatch const&)",
     "/src/recorder/history/src/recording.cpp", "/venv/lib/python3.11/site-packages/cachealloc/libcachealloc_torch.so"},
    {"cachealloc::HistoryRecorder::on_event(cachealloc::AllocatorEvent const&)",
     "/src/recorder/history/src/recording.cpp", "/venv/lib/python3.11/site-packages/cachealloc/libcachealloc_torch.so"},
    {"cachealloc::CachingAllocator::malloc(unsigned long, CUstream_st*)", "/src/recorder/allocator/src/allocator.cpp",
     "/venv/lib/python3.11/site-packages/cachealloc/libcachealloc_torch.so"},
    {"cachealloc::torch_bridge::TorchAllocator::allocate(unsigned long)", "/src/python/src/torch_allocator.cpp",
     "/venv/lib/python3.11/site-packages/cachealloc/libcachealloc_torch.so"},
};

std::vector<NativeFrame> with(std::vector<NativeFrame> frames, const std::vector<NativeFrame>& more) {
  frames.insert(frames.end(), more.begin(), more.end());
  return frames;
}

// The recorder's snapshot of `stacks`, one live allocation each, with each
// frame's file and module as the symbolizer wrote them.
snapshot::Snapshot recorded(const std::vector<std::vector<NativeFrame>>& stacks) {
  analyzer::testing::TraceBuilder b;
  std::vector<snapshot::StackId> ids;
  for (const auto& frames : stacks) {
    std::vector<std::string> functions;
    for (const NativeFrame& frame : frames) functions.push_back(frame.function);
    ids.push_back(b.stack(functions));
  }
  b.segment(0x7f0000000000, std::uint64_t{64} << 20);
  for (std::size_t i = 0; i < ids.size(); ++i)
    b.alloc(0x7f0000000000 + i * (std::uint64_t{1} << 20), std::uint64_t{1} << 20, std::uint64_t{1} << 20, ids[i]);
  snapshot::Snapshot snap = b.build();
  const auto intern = [&](const std::string& text) {
    snap.strings.push_back(text);
    return snapshot::StringId{static_cast<std::uint32_t>(snap.strings.size() - 1)};
  };
  for (std::size_t s = 0; s < stacks.size(); ++s) {
    const snapshot::Stack& stack = snap.stacks[ids[s].value];
    for (std::size_t f = 0; f < stack.frames.size(); ++f) {
      snapshot::Frame& frame = snap.frames[stack.frames[f].value];
      frame.file = intern(stacks[s][f].file);
      frame.module = intern(stacks[s][f].module);
      if (stacks[s][f].file.empty()) frame.line = 0;
    }
  }
  return snap;
}

}  // namespace

TEST_CASE("our recorder's frames are never a site: native frames that stop inside PyTorch say so") {
  // given stacks of our recorder under torch with stacks='native': the frame
  // walk stops in our frames or at PyTorch's first frame
  const std::vector<NativeFrame> stopped_in_ours = kOurFrames;
  const std::vector<NativeFrame> stopped_in_torch =
      with(kOurFrames, {{"", "", kTorchLib + "libtorch_cuda.so"},
                        {"at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*)", "", kTorchLib + "libc10.so"}});
  // a user's C++ frame past PyTorch's
  const std::vector<NativeFrame> user_cpp =
      with(kOurFrames, {{"at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*)", "", kTorchLib + "libc10.so"},
                        {"model::Decoder::forward(at::Tensor const&)", "/home/u/model.cpp", "/home/u/libmodel.so"}});
  // stacks='unwind': through PyTorch's libraries into the interpreter
  const std::vector<NativeFrame> unwound = with(
      kOurFrames, {{"at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>)", "", kTorchLib + "libtorch_cpu.so"},
                   {"at::_ops::addmm::call(at::Tensor const&, at::Tensor const&)", "", kTorchLib + "libtorch_cpu.so"},
                   {"pybind11::cpp_function::dispatcher(_object*, _object*, _object*)", "", kTorchLib + "libtorch_python.so"},
                   {"cfunction_call", "", "/usr/bin/python3.11"},
                   {"_PyEval_EvalFrameDefault", "", "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0"},
                   {"main", "", "/usr/bin/python3.11"}});
  // our recorder in a program without torch whose frames it could not walk past
  const std::vector<NativeFrame> own_only = {
      {"cachealloc::HistoryRecorder::on_event(cachealloc::AllocatorEvent const&)", "", "/usr/lib/libcachealloc.so"},
      {"cachealloc::CachingAllocator::malloc(unsigned long, CUstream_st*)", "", "/usr/lib/libcachealloc.so"}};
  const snapshot::Snapshot snap = recorded({stopped_in_ours, stopped_in_torch, user_cpp, unwound, own_only});
  // when each is named, with the filter on and off
  analyzer::SiteNamer names(snap, analyzer::SiteFilter{});
  analyzer::SiteFilter unfiltered;
  unfiltered.all_frames = true;
  analyzer::SiteNamer raw(snap, unfiltered);
  // then a stack that stops inside PyTorch says so and how to record more
  CHECK(names.site(snapshot::StackId{1}) == kInsideLibtorch);
  CHECK(names.site(snapshot::StackId{2}) == kInsideLibtorch);
  CHECK(raw.site(snapshot::StackId{1}) == kInsideLibtorch);
  // a user's frame is the site
  CHECK(names.site(snapshot::StackId{3}) == "model::Decoder::forward (/home/u/model.cpp:" +
                                                std::to_string(snap.frames[snap.stacks[3].frames.back().value].line) + ")");
  // an unwound stack is named by its op, never by the interpreter's frames
  CHECK(names.site(snapshot::StackId{4}) == "addmm (aten)");
  // and a stack of our frames alone never names one of them
  CHECK(names.site(snapshot::StackId{5}).starts_with("inside cachealloc: no frame of your program"));
  CHECK(raw.site(snapshot::StackId{5}).starts_with("inside cachealloc: no frame of your program"));
  // and top lists no frame of ours, with a note on how to record the user's frames
  analyzer::ReportOptions options;
  const analyzer::Document top = analyzer::top_report(snap, options);
  std::ostringstream text;
  analyzer::render(top, analyzer::Format::table, text);
  CAPTURE(text.str());
  CHECK(text.str().find("HistoryRecorder") == std::string::npos);
  CHECK(text.str().find("CachingAllocator") == std::string::npos);
  CHECK(text.str().find("torch_bridge") == std::string::npos);
  CHECK(text.str().find("stacks='unwind'") != std::string::npos);
}
