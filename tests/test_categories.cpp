// Categories (categories.hpp): each rule on a hand-made trace, and on the
// real PyTorch runs of testdata/pytorch the categories add up to allocated
// at the peak and at the end, with parameters, gradients and optimizer state
// the long-lived bulk of a training run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "cachealloc/analyzer/analysis.hpp"
#include "cachealloc/analyzer/categories.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "counting_events.hpp"
#include "../analyzer/testing/trace_builder.hpp"

using namespace cachealloc;
using analyzer::Category;

namespace {

const std::filesystem::path kPytorch = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch";

// Every moment's categories add up to the replay's allocated there.
void check_sums(analyzer::EventSource& source, const analyzer::Categorization& c) {
  analyzer::AnalysisOptions options;
  options.device = c.device;
  options.timeline = analyzer::AnalysisOptions::Timeline::buckets;
  options.buckets = 50;
  const analyzer::Analysis a = analyze(source, options);
  const std::size_t end = a.event_count == 0 ? analyzer::kNoEvent : a.event_count - 1;
  const auto at = c.at({a.peak_allocated.event, end});
  CHECK(at[0].total() == a.peak_allocated.bytes);
  CHECK(at[1].total() == a.totals_at_end.allocated);
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (const analyzer::TimelineRow& row : a.timeline)
    ranges.emplace_back(row.last_event == analyzer::kNoEvent ? analyzer::kNoEvent : row.first_event, row.last_event);
  const auto rows = c.at_allocated_max(ranges);
  for (std::size_t r = 0; r < rows.size(); ++r) CHECK(rows[r].total() == a.timeline[r].max.allocated);
}

std::vector<std::filesystem::path> pytorch_runs() {
  std::vector<std::filesystem::path> files;
  for (const char* folder : {"", "corpus", "long", "empty_cache", "fragmenting"}) {
    const auto dir = kPytorch / folder;
    if (!std::filesystem::is_directory(dir)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.ends_with(".pickle") || name.ends_with(".pickle.zst")) files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

analyzer::CategoryBytes at_end(const std::filesystem::path& file) {
  analyzer::FileEvents source(file);
  const auto c = analyzer::categorize(source, -1);
  return c.at(source.event_count() - 1);
}

}  // namespace

TEST_CASE("on every PyTorch run in testdata, the categories add up to allocated at the peak, at the end and in every "
          "timeline row") {
  const auto files = pytorch_runs();
  CHECK(files.size() >= 20);
  for (const auto& file : files) {
    CAPTURE(file);
    analyzer::FileEvents source(file);
    const analyzer::Categorization c = analyzer::categorize(source, -1);
    for (const auto& a : c.allocations()) CHECK(a.category.source == analyzer::CategorySource::inferred);
    check_sums(source, c);
  }
}

TEST_CASE("in real training runs, parameters, gradients and optimizer state are the long-lived bulk") {
  // GRU and a small transformer with Adam, Python frames only.
  for (const char* name : {"gru_python_stacks.pickle", "corpus/stacks_python.pickle"}) {
    CAPTURE(name);
    analyzer::FileEvents source(kPytorch / name);
    const auto c = analyzer::categorize(source, -1);
    const analyzer::Analysis a = analyze(source, analyzer::AnalysisOptions{});
    const auto [peak, end] = [&] {
      const auto v = c.at({a.peak_allocated.event, source.event_count() - 1});
      return std::pair{v[0], v[1]};
    }();
    CHECK(peak[Category::parameter] > 0);
    CHECK(peak[Category::gradient] > 0);
    CHECK(peak[Category::activation] > 0);
    // Adam keeps two moments per parameter.
    CHECK(end[Category::optimizer_state] >= 2 * end[Category::parameter]);
    const std::uint64_t state = end[Category::parameter] + end[Category::gradient] + end[Category::optimizer_state];
    CHECK(state * 10 >= end.total() * 9);
  }
  // A conv net with SGD and momentum, C++ and Python frames: cuBLAS's and
  // cuDNN's workspaces named by their frames, the rest of the end state the
  // parameters and the momentum buffers, one per parameter.
  const auto end = at_end(kPytorch / "cnn_train_stacks_all.pickle");
  CHECK(end[Category::workspace] > 0);
  CHECK(end[Category::parameter] > 0);
  CHECK(end[Category::optimizer_state] == end[Category::parameter]);
  CHECK((end[Category::parameter] + end[Category::optimizer_state]) * 2 >= end.total() - end[Category::workspace]);
}

TEST_CASE("a CUDA graph's capture is the CUDA graph pool, and no other run has one") {
  analyzer::FileEvents graph(kPytorch / "corpus" / "cuda_graph.pickle");
  const auto c = analyzer::categorize(graph, -1);
  std::size_t pooled = 0;
  for (const auto& a : c.allocations()) pooled += a.category.category == Category::cuda_graph_pool;
  CHECK(pooled == 24);  // the requests the what-if replay routes to the capture's pool
  for (const char* other : {"gru_python_stacks.pickle", "corpus/streams.pickle", "long/long_train.pickle.zst"}) {
    analyzer::FileEvents source(kPytorch / other);
    for (const auto& a : analyzer::categorize(source, -1).allocations())
      CHECK(a.category.category != Category::cuda_graph_pool);
  }
}

TEST_CASE("given a hand-made training step, when categorized, then each rule gives its category") {
  analyzer::testing::TraceBuilder b;
  constexpr std::uint64_t kMiB = 1 << 20, kBase = 1ull << 30;
  const std::string modules = "/site-packages/torch/nn/modules/";
  const auto to_cuda = b.stack_of({{"convert", modules + "module.py"}, {"_apply", modules + "module.py"}, {"main", "train.py"}});
  const auto linear = b.stack_of({{"forward", modules + "linear.py"}, {"_call_impl", modules + "module.py"}, {"main", "train.py"}});
  const auto workspace = b.stack_of({{"at::cuda::getCUDABlasLtWorkspace()", "CublasHandlePool.cpp"}, {"forward", modules + "linear.py"}});
  const auto user = b.stack_of({{"load_batch", "train.py"}, {"main", "train.py"}});
  const auto log_loss = b.stack_of({{"log_loss", "train.py"}, {"main", "train.py"}});
  const auto backward_call = b.stack_of({{"backward", "/site-packages/torch/_tensor.py"}, {"main", "train.py"}});
  const auto engine = b.stack_of({{"torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor>&&)", "Functions.cpp"},
                                  {"torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "engine.cpp"}});
  const auto accumulate = b.stack_of({{"torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)", "accumulate_grad.cpp"}});
  const auto init_group = b.stack_of({{"_init_group", "/site-packages/torch/optim/adam.py"}, {"step", "/site-packages/torch/optim/adam.py"}});
  const auto adam = b.stack_of({{"_multi_tensor_adam", "/site-packages/torch/optim/adam.py"}, {"step", "/site-packages/torch/optim/adam.py"}});
  const auto zero_grad = b.stack_of({{"zero_grad", "/site-packages/torch/optim/optimizer.py"}, {"main", "train.py"}});
  b.segment(kBase, 64 * kMiB);
  auto at = [&](int i) { return kBase + static_cast<std::uint64_t>(i) * kMiB; };
  b.alloc(at(0), kMiB, kMiB, to_cuda);                  // parameter
  b.alloc(at(1), 2 * kMiB, 2 * kMiB, user);             // input batch, kept: other
  b.alloc(at(3), 4 * kMiB, 4 * kMiB, linear);           // saved for backward: activation
  b.alloc(at(7), 4 * kMiB, 4 * kMiB, workspace);        // cuBLASLt workspace
  b.alloc(at(11), 4 * kMiB, 4 * kMiB, linear).free(at(11), linear);  // forward scratch: temporary
  b.alloc(at(15), 2 * kMiB, 2 * kMiB, user);            // the loss, freed after the step: other
  b.alloc(at(17), 2 * kMiB, 2 * kMiB, backward_call);   // grad of the loss, freed in the same pass: temporary
  b.alloc(at(19), kMiB, kMiB, engine);                  // the parameter's grad: gradient
  b.alloc(at(20), 3 * kMiB, 3 * kMiB, engine);          // lives on, no parameter's size: other
  b.alloc(at(23), 4 * kMiB, 4 * kMiB, engine).free(at(23));  // backward scratch: temporary
  b.alloc(at(27), 2 * kMiB, 2 * kMiB, accumulate);      // AccumulateGrad: gradient
  b.free(at(3), engine);                                // the activation, released by the engine
  b.free(at(17), backward_call);
  b.free(at(15), log_loss);
  b.begin("Optimizer.step#Adam.step");
  b.alloc(at(29), kMiB, kMiB, init_group);              // exp_avg: optimizer state
  b.alloc(at(30), kMiB, kMiB, adam);                    // kept across steps: optimizer state
  b.alloc(at(31), 8 * kMiB, 8 * kMiB, adam).free(at(31), adam);  // foreach scratch: temporary
  b.end("Optimizer.step#Adam.step");
  b.begin("Optimizer.zero_grad#Adam.zero_grad");
  b.free(at(19), zero_grad);
  b.end("Optimizer.zero_grad#Adam.zero_grad");
  const snapshot::Snapshot trace = b.build();
  analyzer::SnapshotEvents source(trace);
  const analyzer::Categorization c = analyzer::categorize(source, -1);

  const std::vector<std::pair<std::uint64_t, Category>> expected = {
      {at(0), Category::parameter},        {at(1), Category::other},
      {at(3), Category::activation},       {at(7), Category::workspace},
      {at(11), Category::temporary},       {at(15), Category::other},
      {at(17), Category::temporary},       {at(19), Category::gradient},
      {at(20), Category::other},           {at(23), Category::temporary},
      {at(27), Category::gradient},        {at(29), Category::optimizer_state},
      {at(30), Category::optimizer_state}, {at(31), Category::temporary}};
  const std::vector<analyzer::CategorizedAllocation> allocations = c.allocations();
  REQUIRE(allocations.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const analyzer::CategorizedAllocation& a = allocations[i];
    CAPTURE(i);
    CHECK(trace.events[a.alloc_event].address == expected[i].first);
    CHECK(analyzer::category_key(a.category.category) == std::string(analyzer::category_key(expected[i].second)));
    CHECK(a.category.source == analyzer::CategorySource::inferred);
  }
  check_sums(source, c);
}

TEST_CASE("an allocation nothing tells apart is other: no frames, no annotations") {
  analyzer::FileEvents source(kPytorch / "no_context.pickle");
  const auto c = analyzer::categorize(source, -1);
  for (const auto& a : c.allocations()) CHECK(a.category.category == Category::other);
}

TEST_CASE("category names: keys, labels and what --max-category accepts") {
  CHECK(std::string(analyzer::category_key(Category::optimizer_state)) == "optimizer_state");
  CHECK(std::string(analyzer::category_label(Category::cuda_graph_pool)) == "CUDA graph pool");
  CHECK(analyzer::parse_category("optimizer-state") == Category::optimizer_state);
  CHECK(analyzer::parse_category("Activation") == Category::activation);
  CHECK(analyzer::parse_category("activations") == std::nullopt);
  CHECK(analyzer::parse_category("") == std::nullopt);
}

namespace {

bool same(const analyzer::CategoryBytes& a, const analyzer::CategoryBytes& b) { return a.bytes == b.bytes; }

// Everything a Categorization answers, from its kept changes and from a
// replay of the source, must be the same figure.
void check_kept_equals_replayed(analyzer::EventSource& source) {
  analyzer::CategorizeOptions replay_only;
  replay_only.max_kept_changes = 0;
  analyzer::CategorizeOptions cut_short;  // the bound reached part way
  cut_short.max_kept_changes = 7;
  const analyzer::Categorization kept = analyzer::categorize(source, -1);
  const analyzer::Categorization replayed = analyzer::categorize(source, -1, replay_only);
  const analyzer::Categorization cut = analyzer::categorize(source, -1, cut_short);
  REQUIRE(!replayed.changes_kept());
  CHECK(kept.allocation_count() == replayed.allocation_count());
  const std::size_t n = source.event_count();
  // Moments: before the first event, then every 1/13 of the trace and the last event.
  std::vector<std::size_t> moments{analyzer::kNoEvent};
  for (std::size_t k = 0; k < 13 && n > 0; ++k) moments.push_back(k * n / 13);
  if (n > 0) moments.push_back(n - 1);
  moments.erase(std::unique(moments.begin(), moments.end()), moments.end());
  std::vector<std::pair<std::size_t, std::size_t>> ranges{{analyzer::kNoEvent, analyzer::kNoEvent}};
  for (std::size_t k = 1; k < moments.size(); ++k)
    ranges.emplace_back(moments[k - 1] == analyzer::kNoEvent ? 0 : moments[k - 1] + 1, moments[k]);
  // The same moments summed by the walk itself (CategorizeOptions::moments).
  analyzer::CategorizeOptions summed = replay_only;
  summed.moments = moments;
  const analyzer::Categorization walked = analyzer::categorize(source, -1, summed);
  {
    const auto a = kept.at(moments), b = walked.at(moments);
    for (std::size_t k = 0; k < a.size(); ++k) CHECK(same(a[k], b[k]));
  }
  // Rows at their allocated maximum summed by the walk itself
  // (CategorizeOptions::allocated_max_ranges): the 13 above, and 101 rows
  // like timeline's, each of whose allocations is settled after its row.
  std::vector<std::pair<std::size_t, std::size_t>> rows{{analyzer::kNoEvent, analyzer::kNoEvent}};
  for (std::size_t k = 0; k < 101 && n > 0; ++k)
    if ((k + 1) * n / 101 > k * n / 101) rows.emplace_back(k * n / 101, (k + 1) * n / 101 - 1);
  for (const auto& wanted : {ranges, rows}) {
    analyzer::CategorizeOptions in_rows = replay_only;
    in_rows.allocated_max_ranges = wanted;
    const analyzer::Categorization rows_walked = analyzer::categorize(source, -1, in_rows);
    const auto a = kept.at_allocated_max(wanted), b = rows_walked.at_allocated_max(wanted);
    for (std::size_t k = 0; k < a.size(); ++k) {
      CAPTURE(k);
      CHECK(same(a[k], b[k]));
    }
  }
  for (const analyzer::Categorization* other : {&replayed, &cut}) {
    const auto a = kept.at(moments), b = other->at(moments);
    for (std::size_t k = 0; k < a.size(); ++k) CHECK(same(a[k], b[k]));
    const auto ra = kept.at_allocated_max(ranges), rb = other->at_allocated_max(ranges);
    for (std::size_t k = 0; k < ra.size(); ++k) CHECK(same(ra[k], rb[k]));
    CHECK(same(kept.peaks(), other->peaks()));
    const auto aa = kept.allocations(), ab = other->allocations();
    REQUIRE(aa.size() == ab.size());
    for (std::size_t k = 0; k < aa.size(); ++k) {
      CHECK(aa[k].alloc_event == ab[k].alloc_event);
      CHECK(aa[k].free_event == ab[k].free_event);
      CHECK(aa[k].bytes == ab[k].bytes);
      CHECK(aa[k].category.category == ab[k].category.category);
    }
  }
  // A follower given every event agrees with at() after each one.
  analyzer::Categorization::Follower follower(replayed);
  std::vector<std::size_t> every;
  analyzer::for_each_event(source, 0, n, [&](std::size_t i, const snapshot::Event&) {
    every.push_back(i);
    return true;
  });
  const auto expected = kept.at(every);
  std::size_t k = 0;
  analyzer::for_each_event(source, 0, n, [&](std::size_t i, const snapshot::Event& e) {
    follower.on_event(i, e);
    CHECK(same(follower.now(), expected[k++]));
    return true;
  });
}

}  // namespace

TEST_CASE("a long trace's categories come from a replay per query, in memory bounded by its layout, and are the same "
          "figures as from changes kept in memory") {
  for (const auto& file : pytorch_runs()) {
    CAPTURE(file);
    analyzer::FileEvents source(file);
    check_kept_equals_replayed(source);
  }
  for (unsigned seed = 1; seed <= 4; ++seed) {
    CAPTURE(seed);
    const snapshot::Snapshot trace = analyzer::testing::random_trace(seed, 20000, 2, 3);
    analyzer::SnapshotEvents source(trace);
    check_kept_equals_replayed(source);
  }
}

TEST_CASE("a category event makes its live allocation's category exact from its alloc on; the last tag wins") {
  // Given allocations tagged after they were made, one tagged twice, a tag
  // where nothing is live, and one left untagged
  analyzer::testing::TraceBuilder b;
  constexpr std::uint64_t kMiB = 1 << 20, kBase = 1ull << 30;
  const auto tag = [&](std::uint64_t address, Category category) {
    b.emit(snapshot::EventKind::category, address, 0, static_cast<std::uint64_t>(category));
  };
  b.segment(kBase, 64 * kMiB);
  b.alloc(kBase, kMiB, kMiB - 100);  // a parameter
  tag(kBase, Category::parameter);
  b.alloc(kBase + kMiB, 2 * kMiB, 2 * kMiB - 7);  // a gradient, first taken for a temporary
  tag(kBase + kMiB, Category::temporary);
  tag(kBase + kMiB, Category::gradient);
  tag(kBase + 40 * kMiB, Category::activation);  // nothing lives there
  b.alloc(kBase + 3 * kMiB, 4 * kMiB, 4 * kMiB);  // untagged
  const std::size_t peak = b.build().events.size() - 1;
  b.free(kBase + kMiB);
  tag(kBase + kMiB, Category::optimizer_state);  // after its free: ignored
  const snapshot::Snapshot s = b.build();

  for (const std::size_t kept : {std::size_t{1} << 20, std::size_t{0}}) {  // the kept changes, and a replay per query
    CAPTURE(kept);
    analyzer::SnapshotEvents source(s);
    analyzer::CategorizeOptions options;
    options.max_kept_changes = kept;
    const std::vector<std::pair<std::size_t, std::size_t>> whole = {{0, s.events.size() - 1}};
    options.allocated_max_ranges = whole;  // summed by the walk itself
    const analyzer::Categorization c = analyzer::categorize(source, 0, options);
    // Then the tagged ones are exact for their whole life, the untagged one inferred
    const auto allocations = c.allocations();
    REQUIRE(allocations.size() == 3);
    CHECK(allocations[0].category.category == Category::parameter);
    CHECK(allocations[0].category.source == analyzer::CategorySource::exact);
    CHECK(allocations[1].category.category == Category::gradient);
    CHECK(allocations[1].category.source == analyzer::CategorySource::exact);
    CHECK(allocations[2].category.source == analyzer::CategorySource::inferred);
    CHECK(allocations[0].requested == kMiB - 100);
    CHECK(c.ignored_tags() == 2);
    CHECK(!c.inferred(Category::parameter));
    CHECK(!c.inferred(Category::gradient));
    CHECK(c.any_exact());
    CHECK(c.any_inferred());
    // And the block and requested bytes of each category are theirs, at any moment
    const auto at = c.at({peak, s.events.size() - 1});
    CHECK(at[0][Category::parameter] == kMiB);
    CHECK(at[0].requested[static_cast<std::size_t>(Category::parameter)] == kMiB - 100);
    CHECK(at[0][Category::gradient] == 2 * kMiB);
    CHECK(at[0].requested[static_cast<std::size_t>(Category::gradient)] == 2 * kMiB - 7);
    CHECK(at[1][Category::gradient] == 0);
    CHECK(at[1].requested[static_cast<std::size_t>(Category::gradient)] == 0);
    CHECK(at[1].requested[static_cast<std::size_t>(Category::parameter)] == kMiB - 100);
    CHECK(c.peaks().requested[static_cast<std::size_t>(Category::gradient)] == 2 * kMiB - 7);
    const analyzer::CategoryBytes at_max = c.at_allocated_max(whole).front();
    CHECK(at_max.requested[static_cast<std::size_t>(Category::parameter)] == kMiB - 100);
    CHECK(at_max.requested[static_cast<std::size_t>(Category::gradient)] == 2 * kMiB - 7);
    std::uint64_t requested_at_max = 0;
    for (const std::uint64_t r : at_max.requested) requested_at_max += r;
    CHECK(requested_at_max == 7 * kMiB - 107);
  }
}

namespace {
// The row of `category` in a document's "categories" table, by column key.
std::map<std::string, analyzer::Value> category_row(const analyzer::Document& doc, Category category) {
  for (const analyzer::Section& section : doc.sections) {
    const auto* table = std::get_if<analyzer::Table>(&section);
    if (table == nullptr || table->key != "categories") continue;
    for (const auto& row : table->rows) {
      if (std::get<std::string>(row.front()) != analyzer::category_key(category)) continue;
      std::map<std::string, analyzer::Value> out;
      for (std::size_t c = 0; c < table->columns.size(); ++c) out[table->columns[c].key] = row[c];
      return out;
    }
  }
  FAIL("no categories table");
  return {};
}
}  // namespace

TEST_CASE("cachealloc-synthetic --exact-categories: summary shows its model's state exact, with the bytes it requested") {
  // Given a run of the synthetic loop that tags its allocations
  const std::filesystem::path out = std::filesystem::path(CACHEALLOC_BINARY_DIR) / "test_categories_synthetic.bin";
  const std::string command = (std::filesystem::path(CACHEALLOC_BINARY_DIR) / "bin" / "cachealloc-synthetic").string() +
                              " --events 20000 --seed 3 --threads 1 --stacks none --exact-categories -f -o " +
                              out.string() + " >/dev/null";
  REQUIRE(std::system(command.c_str()) == 0);
  // The model it keeps: 8 parameters of (i + 1) MiB + 1000 i + 4 bytes, a
  // gradient of each, and Adam's two moments of each.
  std::uint64_t parameters = 0;
  for (std::uint64_t i = 0; i < 8; ++i) parameters += (i + 1) * (1 << 20) + 1000 * i + 4;

  // When summarized
  analyzer::FileEvents source(out);
  const analyzer::Document doc = analyzer::summary_report(source, analyzer::ReportOptions{});

  // Then the model's state is exact, and its requested bytes at the end are what the loop asked for
  const auto parameter = category_row(doc, Category::parameter);
  const auto gradient = category_row(doc, Category::gradient);
  const auto optimizer = category_row(doc, Category::optimizer_state);
  const auto activation = category_row(doc, Category::activation);
  CHECK(std::get<std::string>(parameter.at("source")) == "exact");
  CHECK(std::get<std::string>(gradient.at("source")) == "exact");
  CHECK(std::get<std::string>(optimizer.at("source")) == "exact");
  CHECK(std::get<std::string>(activation.at("source")) == "exact");
  CHECK(std::get<std::uint64_t>(parameter.at("requested_at_end")) == parameters);
  CHECK(std::get<std::uint64_t>(gradient.at("requested_at_end")) == parameters);
  CHECK(std::get<std::uint64_t>(optimizer.at("requested_at_end")) == 2 * parameters);
  CHECK(std::get<std::uint64_t>(activation.at("requested_at_end")) == 0);
  // (blocks are rounded up to 512 B: the block bytes hold more)
  CHECK(std::get<std::uint64_t>(parameter.at("at_end")) > parameters);
  CHECK(std::get<std::uint64_t>(parameter.at("requested_at_peak_allocated")) == parameters);
  std::filesystem::remove(out);
}

namespace {

// The categories an analysis took in its own pass (AnalysisOptions::
// categories) are categorize()'s, figure for figure: every allocation's,
// at the allocated peak and at the end, and at each timeline row's
// allocated maximum. Without its changes kept (AnalysisOptions::
// category_changes false, as summary asks), the figures at other moments
// come from a replay of the source, and are the same.
void check_pass_equals_categorize(analyzer::EventSource& source, analyzer::AnalysisOptions::Timeline timeline,
                                  bool keep_changes = true) {
  analyzer::AnalysisOptions options;
  options.categories = true;
  options.category_changes = keep_changes;
  options.timeline = timeline;
  options.buckets = 101;
  const analyzer::Analysis a = analyzer::analyze(source, options);
  REQUIRE(a.categories);
  const analyzer::Categorization& in_pass = *a.categories;
  if (!keep_changes) CHECK(!in_pass.changes_kept());
  analyzer::CategorizeOptions from_start;
  from_start.start = a.start;
  const analyzer::Categorization walked = analyzer::categorize(source, a.device, from_start);
  const std::size_t n = source.event_count();
  std::vector<std::size_t> moments{a.peak_allocated.event, n == 0 ? analyzer::kNoEvent : n - 1};
  if (moments[1] == analyzer::kNoEvent || (moments[0] != analyzer::kNoEvent && moments[0] > moments[1]))
    std::swap(moments[0], moments[1]);
  const auto at_a = in_pass.at(moments), at_b = walked.at(moments);
  for (std::size_t k = 0; k < at_a.size(); ++k) {
    CHECK(same(at_a[k], at_b[k]));
    CHECK(at_a[k].requested == at_b[k].requested);
  }
  CHECK(in_pass.ignored_tags() == walked.ignored_tags());
  std::vector<std::pair<std::size_t, std::size_t>> rows;
  for (const analyzer::TimelineRow& row : a.timeline)
    rows.emplace_back(row.last_event == analyzer::kNoEvent ? analyzer::kNoEvent : row.first_event, row.last_event);
  const auto rows_a = in_pass.at_allocated_max(rows), rows_b = walked.at_allocated_max(rows);
  REQUIRE(rows_a.size() == rows_b.size());
  for (std::size_t k = 0; k < rows_a.size(); ++k) {
    CAPTURE(k);
    CHECK(same(rows_a[k], rows_b[k]));
    CHECK(rows_a[k].requested == rows_b[k].requested);
    CHECK(rows_a[k].total() == a.timeline[k].max.allocated);
  }
  const auto aa = in_pass.allocations(), ab = walked.allocations();
  REQUIRE(aa.size() == ab.size());
  for (std::size_t k = 0; k < aa.size(); ++k) {
    CAPTURE(k);
    CHECK(aa[k].alloc_event == ab[k].alloc_event);
    CHECK(aa[k].free_event == ab[k].free_event);
    CHECK(aa[k].bytes == ab[k].bytes);
    CHECK(aa[k].category.category == ab[k].category.category);
    CHECK(aa[k].category.source == ab[k].category.source);
  }
}

}  // namespace

TEST_CASE("an analysis that categorizes in its own pass gives categorize()'s figures") {
  using Timeline = analyzer::AnalysisOptions::Timeline;
  for (const auto& file : pytorch_runs()) {
    CAPTURE(file);
    analyzer::FileEvents source(file);
    check_pass_equals_categorize(source, Timeline::buckets);
    check_pass_equals_categorize(source, Timeline::none);
    check_pass_equals_categorize(source, Timeline::buckets, false);
  }
  for (unsigned seed = 1; seed <= 4; ++seed) {
    CAPTURE(seed);
    snapshot::Snapshot trace = analyzer::testing::random_trace(seed, 20000, 2, 3);
    analyzer::SnapshotEvents source(trace);
    check_pass_equals_categorize(source, Timeline::buckets);
    check_pass_equals_categorize(source, Timeline::per_event);
    check_pass_equals_categorize(source, Timeline::buckets, false);
    // The same trace with every third alloc tagged (exact categories) and
    // a tag where nothing lives after every fifth
    std::vector<snapshot::Event> tagged;
    std::size_t allocs = 0;
    for (const snapshot::Event& e : trace.events) {
      tagged.push_back(e);
      if (e.kind != snapshot::EventKind::alloc) continue;
      snapshot::Event tag = e;
      tag.kind = snapshot::EventKind::category;
      tag.size = 0;
      tag.aux = allocs % analyzer::kCategoryCount;
      if (allocs % 3 == 0) tagged.push_back(tag);
      tag.address += 1;
      if (allocs % 5 == 0) tagged.push_back(tag);
      ++allocs;
    }
    trace.events = std::move(tagged);
    analyzer::SnapshotEvents tagged_source(trace);
    check_pass_equals_categorize(tagged_source, Timeline::buckets);
  }
}

TEST_CASE("summary and timeline of a whole trace read its events once, categories included") {
  // Given a trace of several blocks whose start needs no backward pass
  const snapshot::Snapshot trace = analyzer::testing::random_trace(3, 200000, 2, 3);
  analyzer::SnapshotEvents events(trace);
  REQUIRE(events.block_count() > 1);
  analyzer::ReportOptions options;
  options.threads = 1;
  // When summary and timeline are made
  test_support::CountingEvents summary_reads(events);
  analyzer::summary_report(summary_reads, options);
  options.buckets = 100;
  test_support::CountingEvents timeline_reads(events);
  analyzer::timeline_report(timeline_reads, options);
  // Then each reads every block once
  CHECK(summary_reads.reads == events.block_count());
  CHECK(timeline_reads.reads == events.block_count());
}
