// Sites: the first frame of the user's program, on PyTorch's own stacks.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <regex>
#include <sstream>
#include <string>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/reports.hpp"

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

TEST_CASE("on the autograd thread, a site is the backward node, a workspace or the op, never the tensor factory") {
  // Given PyTorch's stacks='all' of a CNN's training steps on the H200: the
  // backward pass runs on the autograd engine's thread, whose stacks have no
  // frame of the user's. Every such allocation's stack passes through
  // at::detail::empty_generic, the first frame past the allocator's.
  const snapshot::Snapshot snap =
      analyzer::load(std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch" / "cnn_train_stacks_all.pickle");
  analyzer::SiteNamer names(snap, analyzer::SiteFilter{});
  std::set<std::string> nodes;
  bool workspace = false;
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
    // When each is named, then it is never the factory, and it is a node
    // (grad_fn's name), a library's workspace, or the ATen op called.
    const std::string site = names.site(snapshot::StackId{s});
    CAPTURE(site);
    CHECK(site.find("empty_generic") == std::string::npos);
    const bool node = site.starts_with("torch::autograd::generated::") && site.find("Backward0::apply(") != std::string::npos;
    if (node) nodes.insert(site.substr(0, site.find("::apply(")));
    workspace |= site.starts_with("at::cuda::setWorkspaceForHandle");
    CHECK((node || site.starts_with("at::cuda::setWorkspaceForHandle") || site.starts_with("at::_ops::")));
  }
  REQUIRE(without_user > 5);
  CHECK(workspace);
  // And the CNN's layers show up by their backward nodes.
  CHECK(nodes.count("torch::autograd::generated::ConvolutionBackward0") == 1);
  CHECK(nodes.count("torch::autograd::generated::AddmmBackward0") == 1);
  CHECK(nodes.count("torch::autograd::generated::ReluBackward0") == 1);
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
