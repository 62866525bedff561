#include "workload.hpp"

#include "../common/conventions.hpp"

#include <atomic>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "cachealloc/errors.hpp"

// The "model" lives outside namespace cachealloc on purpose: it stands for
// the user's program, and the analyzer leaves cachealloc's own frames out of
// sites.
namespace training {
namespace {

using namespace cachealloc;
using synthetic::WorkloadResult;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

// One training loop on one thread. The functions are noinline on purpose:
// each allocates at a call site of its own (data loading, attention, MLP,
// normalization, backward, optimizer), so sites differ as a real model's do,
// and the module recursion varies the call paths above them.
class TrainingLoop {
 public:
  TrainingLoop(CachingAllocator& allocator, HistoryRecorder& recorder, std::uint64_t seed, std::uint64_t limit,
               std::atomic<bool>& done, bool exact_categories)
      : allocator_(allocator),
        recorder_(recorder),
        random_(seed),
        limit_(limit),
        done_(done),
        exact_(exact_categories) {
    Device& device = allocator.device();
    compute_ = device.create_stream();
    copy_ = device.create_stream();
    layers_ = 8 + static_cast<int>(random_() % 17);
    batch_bytes_ = (4 + random_() % 28) * MiB;
    if (exact_) init_parameters();
  }

  WorkloadResult run() {
    WorkloadResult result;
    while (!finished()) {
      step(result.steps++, result);
    }
    return result;
  }

 private:
  bool finished() {
    if (done_.load(std::memory_order_relaxed)) return true;
    // recorded_events() walks the ring's chunks, O(events recorded): asked
    // at every check it made the run quadratic (30 s for 5M events). Asked
    // once per (recorded / 4096) checks, its cost per check stays constant
    // whatever N, and the run stops at most ~0.1% late (exact for small
    // runs), which the ring has room for.
    if (++checks_ < next_check_) return false;
    const std::uint64_t recorded = recorder_.recorded_events();
    next_check_ = checks_ + 1 + recorded / 4096;
    if (recorded < limit_) return false;
    done_.store(true, std::memory_order_relaxed);
    return true;
  }

  std::size_t activation_size() {
    // Most activations are a few MiB; some are large, some tiny.
    const unsigned pick = random_() % 100;
    if (pick < 15) return 512 + random_() % (64 * KiB);
    if (pick < 55) return (1 + random_() % 8) * MiB + random_() % MiB;
    if (pick < 90) return (8 + random_() % 24) * MiB;
    return (32 + random_() % 64) * MiB;
  }

  // Records what `p` is, with --exact-categories.
  void tag(void* p, events::AllocationCategory category) {
    if (exact_) recorder_.tag_category(reinterpret_cast<std::uintptr_t>(p), category);
  }

  // The model's state, kept to the end (WorkloadOptions::exact_categories).
  __attribute__((noinline)) void init_parameters() {
    for (int i = 0; i < synthetic::kExactParameters; ++i) {
      parameters_.push_back(allocator_.allocate(synthetic::parameter_bytes(i), compute_));
      tag(parameters_.back(), events::AllocationCategory::parameter);
    }
  }
  __attribute__((noinline)) void accumulate_gradients() {
    for (int i = 0; i < synthetic::kExactParameters && model_gradients_.size() < parameters_.size(); ++i) {
      model_gradients_.push_back(allocator_.allocate(synthetic::parameter_bytes(i), compute_));
      tag(model_gradients_.back(), events::AllocationCategory::gradient);
    }
  }
  __attribute__((noinline)) void init_optimizer_state() {
    for (int i = 0; i < synthetic::kExactParameters && optimizer_state_.size() < 2 * parameters_.size(); ++i) {
      for (int moment = 0; moment < 2; ++moment) {
        optimizer_state_.push_back(allocator_.allocate(synthetic::parameter_bytes(i), compute_));
        tag(optimizer_state_.back(), events::AllocationCategory::optimizer_state);
      }
    }
  }

  __attribute__((noinline)) void* load_batch() {
    void* batch = allocator_.allocate(batch_bytes_, copy_);
    allocator_.record_stream(batch, compute_);  // consumed on the compute stream
    return batch;
  }

  __attribute__((noinline)) void* attention_forward(std::size_t bytes) {
    void* scores = allocator_.allocate(bytes / 2 + 512, compute_);
    void* out = allocator_.allocate(bytes, compute_);
    allocator_.deallocate(scores);
    return out;
  }

  __attribute__((noinline)) void* mlp_forward(int depth, std::size_t bytes) {
    if (depth > 0) return mlp_forward(depth - 1, bytes);
    void* hidden = allocator_.allocate(512 + random_() % (256 * KiB), compute_);
    void* out = allocator_.allocate(bytes, compute_);
    allocator_.deallocate(hidden);
    return out;
  }

  __attribute__((noinline)) void* norm_forward(std::size_t bytes) { return allocator_.allocate(bytes, compute_); }

  __attribute__((noinline)) void* layer_forward(int layer) {
    const std::size_t bytes = activation_size();
    switch (layer % 3) {
      case 0: return attention_forward(bytes);
      case 1: return mlp_forward(layer % 4, bytes);
      default: return norm_forward(bytes);
    }
  }

  void* tagged_layer_forward(int layer) {
    void* out = layer_forward(layer);
    tag(out, events::AllocationCategory::activation);
    return out;
  }

  __attribute__((noinline)) void layer_backward(void* activation, std::vector<void*>& grads) {
    void* grad_input = allocator_.allocate(activation_size(), compute_);
    void* weight_grad = allocator_.allocate(64 * KiB + random_() % (2 * MiB), compute_);
    tag(weight_grad, events::AllocationCategory::gradient);
    allocator_.deallocate(activation);
    allocator_.deallocate(grad_input);
    grads.push_back(weight_grad);
  }

  __attribute__((noinline)) void optimizer_step(std::vector<void*>& grads) {
    for (void* g : grads) {
      void* state = allocator_.allocate(4 * KiB + random_() % (512 * KiB), compute_);
      tag(state, events::AllocationCategory::optimizer_state);
      allocator_.deallocate(state);
      allocator_.deallocate(g);
    }
    grads.clear();
  }

  __attribute__((noinline)) void try_too_large(WorkloadResult& result) {
    // A request beyond the memory-fraction cap: the allocator frees its
    // cache, retries, and throws; the loop goes on, as a training script
    // that catches OOM and lowers its batch size would.
    try {
      void* p = allocator_.allocate(allocator_.memory_cap() + (1 + random_() % 8) * 1024 * MiB, compute_);
      allocator_.deallocate(p);
    } catch (const OutOfMemoryError&) {
      ++result.ooms;
    }
  }

  void step(std::uint64_t number, WorkloadResult& result) {
    AnnotationScope step_scope(recorder_, "step " + std::to_string(number));
    std::vector<void*> activations;
    std::vector<void*> grads;
    void* batch = load_batch();
    {
      AnnotationScope phase(recorder_, "forward");
      for (int layer = 0; layer < layers_ && !finished(); ++layer) activations.push_back(tagged_layer_forward(layer));
    }
    allocator_.deallocate(batch);  // waits for the compute stream's event
    {
      AnnotationScope phase(recorder_, "backward");
      while (!activations.empty()) {
        layer_backward(activations.back(), grads);
        activations.pop_back();
      }
      if (exact_) accumulate_gradients();
    }
    {
      AnnotationScope phase(recorder_, "optimizer");
      optimizer_step(grads);
      if (exact_) init_optimizer_state();
    }
    if (random_() % 4 == 0) allocator_.device().synchronize_stream(compute_);
    if (random_() % 53 == 0) allocator_.empty_cache();
    if (random_() % 97 == 0) try_too_large(result);
  }

  CachingAllocator& allocator_;
  HistoryRecorder& recorder_;
  std::mt19937_64 random_;
  std::uint64_t limit_;
  std::atomic<bool>& done_;
  bool exact_ = false;
  std::vector<void*> parameters_, model_gradients_, optimizer_state_;  // the model's state, kept to the end
  std::uint64_t checks_ = 0;      // calls of finished()
  std::uint64_t next_check_ = 0;  // the call that asks the recorder next
  Stream compute_{};
  Stream copy_{};
  int layers_ = 12;
  std::size_t batch_bytes_ = 0;
};

}  // namespace
}  // namespace training

namespace cachealloc::synthetic {

WorkloadResult run_workload(const WorkloadOptions& options, const std::filesystem::path& output) {
  if (options.events == 0) throw InvalidArgument("--events must be at least 1");
  if (options.threads == 0) throw InvalidArgument("--threads must be at least 1");
  SimulatedDeviceOptions device_options;  // an H200
  device_options.events_complete_immediately = false;
  auto device = make_simulated_device(device_options);
  CachingAllocator allocator(device);
  allocator.set_memory_fraction(0.1);
  HistoryOptions history;
  // The loop stops once `events` are recorded, then closes its step (frees,
  // annotation ends): the ring has room for that tail, so it never
  // overflows and the file holds the whole run (no lower bounds).
  history.max_entries = options.events + std::max<std::uint64_t>(options.events / 8, 65536);
  history.stacks = options.stacks;
  if (options.stream) {
    // The ring then only passes chunks to the stream's writer.
    history.max_entries = 65536;
    history.stream = output;
    history.stream_when_full = options.stream_when_full;
  }
  HistoryRecorder recorder(allocator, history);

  std::atomic<bool> done{false};
  std::vector<WorkloadResult> results(options.threads);
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < options.threads; ++t) {
    threads.emplace_back([&, t] {
      training::TrainingLoop loop(allocator, recorder, options.seed * 1000003 + t, options.events, done,
                                  options.exact_categories);
      results[t] = loop.run();
    });
  }
  {
    training::TrainingLoop loop(allocator, recorder, options.seed * 1000003, options.events, done,
                                options.exact_categories);
    results[0] = loop.run();
  }
  for (auto& thread : threads) thread.join();
  recorder.stop();
  WorkloadResult total;
  total.recorded = recorder.recorded_events();
  if (options.stream) {
    total.stream = recorder.stream_status();
    if (!total.stream.error.empty()) throw cachealloc::cli::UsageError("cannot write " + output.string());
    total.ring_overflowed = total.stream.dropped_events > 0;
  } else {
    if (!recorder.dump_snapshot(output)) throw cachealloc::cli::UsageError("cannot write " + output.string());
    total.ring_overflowed = total.recorded > history.max_entries;
  }
  for (const auto& r : results) {
    total.steps += r.steps;
    total.ooms += r.ooms;
  }
  return total;
}

}  // namespace cachealloc::synthetic
