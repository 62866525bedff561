// libcachealloc_torch.so: our caching allocator and recorder as PyTorch's
// CUDA allocator (c10::cuda::CUDACachingAllocator::CUDAAllocator, PyTorch
// 2.11), so every torch.cuda memory call keeps working after the switch:
// memory_stats() and what derives from it, reset_peak_memory_stats,
// empty_cache, set_per_process_memory_fraction, record_stream,
// caching_allocator_alloc/_delete, _record_memory_history, _snapshot and
// _dump_snapshot, the OOM observer and torch.cuda.OutOfMemoryError.
//
// Python frames: when _record_memory_history asks for them, PyTorch's own
// context hook is called at each allocation (and at each free with
// context='all'), as PyTorch's allocator does; _snapshot() and
// _dump_snapshot() then carry them. Our own recorder then captures them too
// (python_frames.hpp, installed by cachealloc_torch_install), after its
// native C++ frames, for our own dump (cachealloc.dump).
//
// Private pools (CUDA graph capture, torch.cuda.graphs, torch.cuda.MemPool
// and use_mem_pool) are our allocator's (CachingAllocator::begin_allocate_to_pool).
//
// So are the pool checkpoints of CUDA graph trees (torch.compile's
// mode="reduce-overhead"): CachingAllocator::checkpoint_pool/restore_pool.
//
// Not supported yet, each refused with a RuntimeError that says so:
// MemPools with their own allocator or use_on_oom/no_split, and IPC handles.
// Allocator trace trackers are kept, never called.
//
// cachealloc.torch.install() (python/cachealloc/torch.py) loads this library
// with ctypes and calls cachealloc_torch_install() before the first CUDA
// tensor. pip install ./python builds it (python/setup.py, python/CMakeLists.txt).
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <unordered_set>
#include <unordered_map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cachealloc/allocator.hpp"
#include "cachealloc/config.hpp"
#include "cachealloc/device.hpp"
#include "cachealloc/errors.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/format.hpp"
#if CACHEALLOC_HAVE_PYTHON_FRAMES
#include "python_frames.hpp"
#endif

// A named namespace, so that the analyzer's site filter knows these frames
// for the allocator's own ("cachealloc::").
namespace cachealloc::torch_bridge {

namespace CA = c10::cuda::CUDACachingAllocator;
namespace CDA = c10::CachingDeviceAllocator;
using cachealloc::snapshot::BlockState;
using cachealloc::snapshot::EventKind;

constexpr int kMaxDevices = 64;
cachealloc::PrivatePoolId pool_id(c10::MempoolId_t id) { return cachealloc::PrivatePoolId{id.first, id.second}; }

std::uint64_t monotonic_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// PyTorch's settings apply to our allocator too: PYTORCH_CUDA_ALLOC_CONF (or
// PYTORCH_ALLOC_CONF), then CACHEALLOC_CONF when set.
cachealloc::AllocatorConfig config_from_pytorch_environment() {
  for (const char* name : {"CACHEALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    if (const char* text = std::getenv(name); text != nullptr && *text != '\0') {
      try {
        return cachealloc::parse_config(text);
      } catch (const cachealloc::Error& error) {
        TORCH_CHECK(false, "cachealloc: ", name, ": ", error.what());
      }
    }
  }
  return {};
}

void copy_stat(const cachealloc::Stat& from, c10::CachingAllocator::Stat& to) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

void copy_stats(const cachealloc::StatArray& from, c10::CachingAllocator::StatArray& to) {
  for (std::size_t i = 0; i < cachealloc::kStatTypes; ++i) copy_stat(from[i], to[i]);
}

// PyTorch's contexts (Python and C++ frames from its own hook), kept beside
// our recorder: those of live blocks, and those of the recent allocations
// and frees in order, matched to the recorder's events by address in
// _snapshot().
struct ContextRecord {
  std::uintptr_t address = 0;
  bool is_free = false;
  std::shared_ptr<c10::GatheredContext> context;
};
struct Contexts {
  // Set once a context is kept, never cleared: until then a free has no
  // entry to erase and takes no lock (the path with history off).
  std::atomic<bool> used{false};
  std::mutex mutex;
  std::unordered_map<std::uintptr_t, std::shared_ptr<c10::GatheredContext>> live;
  std::deque<ContextRecord> recent;
};

struct Checkpoint final : CA::AllocatorState {
  c10::DeviceIndex device = 0;
  cachealloc::PoolCheckpoint checkpoint;
};

struct DeviceState {
  Contexts contexts;
  std::unique_ptr<cachealloc::CachingAllocator> allocator;
  std::unique_ptr<cachealloc::HistoryRecorder> history;
  double fraction = 1.0;
  // The clocks at the start of recording, to turn our monotonic times into
  // PyTorch's approximate clock in _snapshot().
  std::uint64_t start_ns = 0;
  c10::approx_time_t start_approx{};
};

class TorchAllocator final : public CA::CUDAAllocator {
 public:
  // --- c10::Allocator ---
  c10::DataPtr allocate(size_t bytes) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    if (bytes == 0) return {nullptr, nullptr, &raw_delete_function, c10::Device(c10::DeviceType::CUDA, device)};
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void* ptr = allocate_on(device, bytes, stream);
    return {ptr, ptr, &raw_delete_function, c10::Device(c10::DeviceType::CUDA, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete_function; }
  void copy_data(void* dest, const void* src, std::size_t count) const final {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // --- c10::DeviceAllocator ---
  bool initialized() override { return initialized_.load(std::memory_order_acquire); }
  void emptyCache(c10::MempoolId_t mempool_id) override {
    for (int d = 0; d < device_count_; ++d) {
      if (DeviceState* state = existing(d)) state->allocator->empty_cache(pool_id(mempool_id));
    }
  }
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (ptr.get() == nullptr) return;
    state(ptr.device().index()).allocator->record_stream(
        ptr.get(), cachealloc::Stream{reinterpret_cast<std::uintptr_t>(stream.stream())});
  }
  CDA::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const cachealloc::MemoryStats s = state(device).allocator->stats();
    CDA::DeviceStats out;
    copy_stats(s.allocation, out.allocation);
    copy_stats(s.segment, out.segment);
    copy_stats(s.active, out.active);
    copy_stats(s.inactive_split, out.inactive_split);
    copy_stats(s.allocated_bytes, out.allocated_bytes);
    copy_stats(s.reserved_bytes, out.reserved_bytes);
    copy_stats(s.active_bytes, out.active_bytes);
    copy_stats(s.inactive_split_bytes, out.inactive_split_bytes);
    copy_stats(s.requested_bytes, out.requested_bytes);
    copy_stat(s.oversize_allocations, out.oversize_allocations);
    copy_stat(s.oversize_segments, out.oversize_segments);
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    out.num_sync_all_streams = s.num_sync_all_streams;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    out.max_split_size = s.max_split_size;
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override { state(device).allocator->reset_accumulated_stats(); }
  void resetPeakStats(c10::DeviceIndex device) override { state(device).allocator->reset_peak_stats(); }

  // --- CUDAAllocator ---
  void* raw_alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const c10::DeviceIndex device = c10::cuda::current_device();
    return allocate_on(device, bytes, c10::cuda::getCurrentCUDAStream(device).stream());
  }
  void* raw_alloc_with_stream(size_t bytes, cudaStream_t stream) override {
    if (bytes == 0) return nullptr;
    return allocate_on(c10::cuda::current_device(), bytes, stream);
  }
  void raw_delete(void* ptr) override { free_pointer(ptr); }
  void init(int device_count) override {
    TORCH_CHECK(device_count <= kMaxDevices, "cachealloc: more than ", kMaxDevices, " CUDA devices");
    device_count_ = device_count;
    initialized_.store(true, std::memory_order_release);
  }
  double getMemoryFraction(c10::DeviceIndex device) override { return state(device).fraction; }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    DeviceState& s = state(device);
    try {
      s.allocator->set_memory_fraction(fraction);
    } catch (const cachealloc::Error& error) {
      TORCH_CHECK(false, "cachealloc: ", error.what());
    }
    s.fraction = fraction;
  }
  std::vector<CA::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    std::vector<CA::StreamSegmentSize> sizes;
    for (const cachealloc::snapshot::Segment& segment : state(device).allocator->layout()) {
      if (!segment.expandable) continue;
      std::size_t mapped = 0;
      for (const auto& block : segment.blocks) {
        if (block.state != BlockState::unmapped) mapped += block.size;
      }
      sizes.emplace_back(reinterpret_cast<cudaStream_t>(segment.stream), !segment.large_pool, mapped);
    }
    return sizes;
  }
  void enable(bool value) override { enabled_ = value; }
  bool isEnabled() const override { return enabled_; }
  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override {
    // The largest cached free block (cudnn sizes its workspace by it).
    std::size_t largest = 0;
    for (const cachealloc::snapshot::Segment& segment : state(device).allocator->layout()) {
      for (const auto& block : segment.blocks) {
        if (block.state == BlockState::inactive) largest = std::max<std::size_t>(largest, block.size);
      }
    }
    if (largest == 0) {
      size_t free = 0;
      size_t total = 0;
      c10::cuda::CUDAGuard guard(device);
      C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
      largest = free;
    }
    *largest_block = largest;
  }
  void* getBaseAllocation(void* ptr, size_t* size) override {
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    for (int d = 0; d < device_count_; ++d) {
      DeviceState* s = existing(d);
      if (s == nullptr) continue;
      for (const cachealloc::snapshot::Segment& segment : s->allocator->layout()) {
        if (address >= segment.address && address < segment.address + segment.total_size) {
          if (size != nullptr) *size = segment.total_size;
          return reinterpret_cast<void*>(segment.address);
        }
      }
    }
    TORCH_CHECK(false, "cachealloc: ", ptr, " is not memory of this allocator");
  }
  using CA::CUDAAllocator::recordStream;
  CA::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override;
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    pool_call([&] {
      state(device).allocator->begin_allocate_to_pool(
          pool_id(mempool_id),
          [filter = std::move(filter)](cachealloc::Stream s) { return filter(reinterpret_cast<cudaStream_t>(s.handle)); });
    });
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    pool_call([&] { state(device).allocator->end_allocate_to_pool(pool_id(mempool_id)); });
  }
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    pool_call([&] { state(device).allocator->release_pool(pool_id(mempool_id)); });
  }
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    return state(device).allocator->pool_use_count(pool_id(mempool_id));
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<CA::CUDAAllocator> allocator) override {
    TORCH_CHECK(allocator == nullptr,
                "cachealloc does not support a MemPool with an allocator of its own yet (torch.cuda.MemPool(allocator=...))");
    pool_call([&] { state(device).allocator->create_or_incref_pool(pool_id(mempool_id)); });
  }
  void setUseOnOOM(c10::DeviceIndex, c10::MempoolId_t, bool use_on_oom) override {
    TORCH_CHECK(!use_on_oom, "cachealloc does not support MemPool(use_on_oom=True) yet");
  }
  void setNoSplit(c10::DeviceIndex, c10::MempoolId_t) override {
    TORCH_CHECK(false, "cachealloc does not support MemPool(no_split=True) yet");
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected) override {
    cachealloc::CachingAllocator& allocator = *state(device).allocator;
    const std::map<std::uintptr_t, cachealloc::PrivatePoolId> owners = allocator.private_segments();
    std::size_t live = 0;
    for (const cachealloc::snapshot::Segment& segment : allocator.layout()) {
      auto owner = owners.find(segment.address);
      if (owner == owners.end() || owner->second != pool_id(mempool_id)) continue;
      for (const auto& block : segment.blocks) {
        if (block.state != BlockState::active_allocated) continue;
        if (!expected.contains(reinterpret_cast<void*>(block.address))) return false;
        ++live;
      }
    }
    return live == expected.size();
  }
  CA::ShareableHandle shareIpcHandle(void*) override {
    TORCH_CHECK(false, "cachealloc does not support CUDA IPC handles (sharing tensors between processes) yet");
  }
  std::shared_ptr<void> getIpcDevPtr(std::string) override {
    TORCH_CHECK(false, "cachealloc does not support CUDA IPC handles (sharing tensors between processes) yet");
  }
  bool isHistoryEnabled() override {
    std::lock_guard lock(mutex_);
    for (int d = 0; d < device_count_; ++d) {
      DeviceState* s = states_[d].load(std::memory_order_acquire);
      if (s != nullptr && s->history && s->history->recording()) return true;
    }
    return history_wanted_;
  }
  void recordHistory(bool enabled, CA::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     CA::RecordContext when, bool clear_history,
                     const std::vector<std::string>& skip_actions) override;
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    std::string stage;
    std::string name;
    for (const auto& [key, value] : md) {
      if (key == "stage") stage = value;
      if (key == "name") name = value;
    }
    DeviceState* s = existing(c10::cuda::current_device());
    if (s == nullptr || !s->history) return;
    if (stage == "START") s->history->annotate_begin(name);
    if (stage == "END") s->history->annotate_end();
  }
  void attachOutOfMemoryObserver(CA::OutOfMemoryObserver observer) override {
    std::lock_guard lock(mutex_);
    oom_observers_.push_back(std::move(observer));
  }
  // Trace trackers (used by some distributed back ends to register memory)
  // are kept but never called: our allocator has no hook for them yet.
  void attachAllocatorTraceTracker(CA::AllocatorTraceTracker tracker) override {
    std::lock_guard lock(mutex_);
    trace_trackers_.push_back(std::move(tracker));
  }
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    const cudaError_t error = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (error == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
      return;
    }
    C10_CUDA_CHECK(error);
  }
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    if (p2p_enabled || dst_device == src_device) return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
  }
  // CUDA graph trees (torch.compile's mode="reduce-overhead") checkpoint a
  // private pool after each recording and put it back before recording
  // from another point of the tree.
  std::shared_ptr<CA::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override {
    auto state = std::make_shared<Checkpoint>();
    state->device = device;
    pool_call([&] { state->checkpoint = this->state(device).allocator->checkpoint_pool(pool_id(id)); });
    return state;
  }
  CA::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                             std::shared_ptr<CA::AllocatorState> opaque) override {
    auto* saved = dynamic_cast<Checkpoint*>(opaque.get());
    TORCH_CHECK(saved != nullptr, "cachealloc: setCheckpointPoolState with a state another allocator made");
    TORCH_CHECK(saved->device == device, "cachealloc: a checkpoint of device ", static_cast<int>(saved->device),
                " applied to device ", static_cast<int>(device));
    DeviceState& s = state(device);
    cachealloc::PoolRestore restored;
    pool_call([&] { restored = s.allocator->restore_pool(saved->checkpoint); });
    {
      std::lock_guard lock(s.contexts.mutex);
      for (void* ptr : restored.freed) s.contexts.live.erase(reinterpret_cast<std::uintptr_t>(ptr));
    }
    CA::CheckpointDelta delta;
    delta.ptrs_freed = std::move(restored.freed);
    for (void* ptr : restored.allocated)
      delta.dataptrs_allocd.emplace_back(ptr, ptr, &raw_delete_function, c10::Device(c10::DeviceType::CUDA, device));
    return delta;
  }
  std::string name() override { return "cachealloc"; }

  // --- for the Python package (C ABI below) ---
  void annotate(bool begin, const std::string& text) {
    DeviceState* s = existing(c10::cuda::current_device());
    if (s == nullptr || !s->history) return;
    if (begin) s->history->annotate_begin(text);
    else s->history->annotate_end();
  }
  // A category learned from torch's state (cachealloc.track_categories) for
  // the live allocation at `address` on `device`; nothing while it records nothing.
  void tag_category(int device, std::uintptr_t address, cachealloc::events::AllocationCategory category) {
    DeviceState* s = existing(device);
    if (s == nullptr || !s->history) return;
    s->history->tag_category(address, category);
  }
  bool dump(int device, const std::string& path) {
    DeviceState* s = existing(device);
    if (s == nullptr || !s->history) return false;
    return s->history->dump_snapshot(path);
  }
  void set_torch_frames(bool on) { torch_frames_.store(on, std::memory_order_relaxed); }
  void set_native_stacks(cachealloc::StackCapture capture) {
    std::lock_guard lock(mutex_);
    native_stacks_ = capture;
  }
  void set_stream(std::string pattern) {
    std::lock_guard lock(mutex_);
    stream_pattern_ = std::move(pattern);
  }
  std::string summary(int device) { return state(static_cast<c10::DeviceIndex>(device)).allocator->memory_summary(); }

  static TorchAllocator& instance();

 private:
  static void raw_delete_function(void* ptr) { instance().free_pointer(ptr); }

  template <typename F>
  static void pool_call(F&& f) {
    try {
      f();
    } catch (const cachealloc::Error& error) {
      TORCH_CHECK(false, "cachealloc: ", error.what());
    }
  }

  DeviceState* existing(int device) {
    if (device < 0 || device >= kMaxDevices) return nullptr;
    return states_[device].load(std::memory_order_acquire);
  }

  // The device's allocator, made on first use (on the cuda backend of that
  // device, with PyTorch's settings).
  DeviceState& state(c10::DeviceIndex device) {
    TORCH_CHECK(device >= 0 && device < kMaxDevices, "cachealloc: invalid device ", static_cast<int>(device));
    if (DeviceState* s = states_[device].load(std::memory_order_acquire)) return *s;
    std::lock_guard lock(mutex_);
    if (DeviceState* s = states_[device].load(std::memory_order_relaxed)) return *s;
    auto made = std::make_unique<DeviceState>();
    try {
      c10::cuda::CUDAGuard guard(device);
      made->allocator = std::make_unique<cachealloc::CachingAllocator>(cachealloc::make_cuda_device(device),
                                                                        config_from_pytorch_environment());
      cachealloc::HistoryOptions off;
      off.enabled = false;
      made->history = std::make_unique<cachealloc::HistoryRecorder>(*made->allocator, off);
      if (history_wanted_) start_history(*made);
    } catch (const cachealloc::Error& error) {
      TORCH_CHECK(false, "cachealloc: device ", static_cast<int>(device), ": ", error.what());
    }
    DeviceState* raw = made.release();
    states_[device].store(raw, std::memory_order_release);
    return *raw;
  }

  // Under mutex_. With a stream (cachealloc.record(stream=...)), each device
  // writes its own file: "{device}" in the path tells them apart; without
  // it only the first device to record streams, and the others say so.
  void start_history(DeviceState& s) {
    s.start_ns = monotonic_ns();
    s.start_approx = c10::getApproximateTime();
    cachealloc::HistoryOptions options = history_options_;
    const int device = s.allocator->device().index();
    if (!stream_pattern_.empty()) {
      const bool per_device = stream_pattern_.find("{device}") != std::string::npos;
      if (per_device || stream_device_ < 0 || stream_device_ == device) {
        options.stream = cachealloc::expand_stream_path(stream_pattern_, static_cast<long>(getpid()), device);
        if (!per_device) stream_device_ = device;
      } else {
        std::fprintf(stderr, "cachealloc: device %d is not streamed: %s is device %d's; put {device} in the path\n",
                     device, stream_pattern_.c_str(), stream_device_);
      }
    }
    try {
      s.history->start(options);
    } catch (const std::exception& error) {
      if (options.stream.empty()) throw;
      // Recording never takes the program down: the ring records instead.
      std::fprintf(stderr, "cachealloc: %s; recording device %d without a stream\n", error.what(), device);
      options.stream.clear();
      s.history->start(options);
    }
  }

  void* allocate_on(c10::DeviceIndex device, size_t bytes, cudaStream_t stream) {
    DeviceState& s = state(device);
    // As PyTorch's allocator: the context is gathered before the allocation.
    const CA::CreateContextFn gather = context_recorder_.load(std::memory_order_acquire);
    std::shared_ptr<c10::GatheredContext> context = gather != nullptr ? gather() : nullptr;
    try {
      void* ptr = s.allocator->allocate(bytes, cachealloc::Stream{reinterpret_cast<std::uintptr_t>(stream)});
      if (context) {
        const auto address = reinterpret_cast<std::uintptr_t>(ptr);
        s.contexts.used.store(true, std::memory_order_release);
        std::lock_guard lock(s.contexts.mutex);
        s.contexts.live[address] = context;
        if (context_when_.load(std::memory_order_relaxed) >= static_cast<int>(CA::RecordContext::ALLOC)) {
          s.contexts.recent.push_back({address, false, std::move(context)});
          if (s.contexts.recent.size() > context_capacity_.load(std::memory_order_relaxed)) s.contexts.recent.pop_front();
        }
      }
      return ptr;
    } catch (const cachealloc::OutOfMemoryError& error) {
      std::vector<CA::OutOfMemoryObserver> observers;
      {
        std::lock_guard lock(mutex_);
        observers = oom_observers_;
      }
      size_t free = 0;
      size_t total = 0;
      (void)cudaMemGetInfo(&free, &total);
      (void)cudaGetLastError();
      for (const auto& observer : observers) observer(device, error.allocated(), total, free);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory (cachealloc). ", error.what());
    } catch (const cachealloc::Error& error) {
      TORCH_CHECK(false, "cachealloc: ", error.what());
    }
  }

  void free_pointer(void* ptr) {
    if (ptr == nullptr) return;
    const CA::CreateContextFn gather = context_recorder_.load(std::memory_order_acquire);
    std::shared_ptr<c10::GatheredContext> context =
        gather != nullptr && context_when_.load(std::memory_order_relaxed) == static_cast<int>(CA::RecordContext::ALL)
            ? gather()
            : nullptr;
    auto freed = [&](DeviceState& s) {
      if (s.allocator->deallocate(ptr) != cachealloc::FreeStatus::ok) return false;
      if (!context && !s.contexts.used.load(std::memory_order_acquire)) return true;
      const auto address = reinterpret_cast<std::uintptr_t>(ptr);
      std::lock_guard lock(s.contexts.mutex);
      s.contexts.live.erase(address);
      if (context) {
        s.contexts.recent.push_back({address, true, std::move(context)});
        if (s.contexts.recent.size() > context_capacity_.load(std::memory_order_relaxed)) s.contexts.recent.pop_front();
      }
      return true;
    };
    // With one device, no question; else most frees are on the current
    // device, and the others are found by trying.
    if (device_count_ == 1) {
      if (DeviceState* s = existing(0); s != nullptr && freed(*s)) return;
      TORCH_CHECK(false, "cachealloc: free of ", ptr, ", which this allocator did not hand out (or already freed)");
    }
    const int current = c10::cuda::current_device();
    if (DeviceState* s = existing(current); s != nullptr && freed(*s)) return;
    for (int d = 0; d < device_count_; ++d) {
      if (d == current) continue;
      DeviceState* s = existing(d);
      if (s != nullptr && freed(*s)) return;
    }
    TORCH_CHECK(false, "cachealloc: free of ", ptr, ", which this allocator did not hand out (or already freed)");
  }

  std::array<std::atomic<DeviceState*>, kMaxDevices> states_{};
  std::atomic<bool> initialized_{false};
  int device_count_ = 0;
  bool enabled_ = true;
  std::mutex mutex_;
  bool history_wanted_ = false;
  cachealloc::HistoryOptions history_options_;
  std::vector<CA::OutOfMemoryObserver> oom_observers_;
  std::vector<CA::AllocatorTraceTracker> trace_trackers_;
  // PyTorch's context hook while history asks for frames, else null.
  std::atomic<CA::CreateContextFn> context_recorder_{nullptr};
  std::atomic<bool> torch_frames_{true};
  std::atomic<int> context_when_{0};
  std::atomic<std::size_t> context_capacity_{0};
  std::size_t trace_max_entries_ = 0;
  std::string stream_pattern_;  // cachealloc_torch_set_stream; "" records to the ring only
  int stream_device_ = -1;      // the device a pattern without {device} streams
  cachealloc::StackCapture native_stacks_ = [] {
    const char* text = std::getenv("CACHEALLOC_TORCH_STACKS");
    try {
      return text != nullptr && *text != '\0' ? cachealloc::parse_stack_capture(text) : cachealloc::StackCapture::native;
    } catch (const cachealloc::Error&) {
      std::fprintf(stderr, "cachealloc: CACHEALLOC_TORCH_STACKS=%s is not a stack capture (none, native, unwind, ...); using native\n", text);
      return cachealloc::StackCapture::native;
    }
  }();  // PyTorch's max_entries: the trace keeps its last entries
};

TorchAllocator& TorchAllocator::instance() {
  // Never destroyed: tensors freed during interpreter shutdown still reach it.
  static auto* allocator = new std::shared_ptr<TorchAllocator>(std::make_shared<TorchAllocator>());
  return **allocator;
}

void TorchAllocator::recordHistory(bool enabled, CA::CreateContextFn context_recorder,
                                   size_t alloc_trace_max_entries, CA::RecordContext when, bool clear_history,
                                   const std::vector<std::string>& /*skip_actions*/) {
  std::lock_guard lock(mutex_);
  history_wanted_ = enabled;
  if (enabled) {
    history_options_ = {};
    // PyTorch counts trace entries; our ring also holds splits and merges
    // (about two more per allocation), so it gets room for them.
    history_options_.max_entries = std::max<std::size_t>(1, alloc_trace_max_entries) * 3;
    // Through torch's API our recorder walks frame pointers (tens of ns),
    // which stop at PyTorch's first frame: the frames users see come from
    // PyTorch's own hook. cachealloc.record() (default stacks="unwind") or
    // CACHEALLOC_TORCH_STACKS=unwind make our own dump unwind (DWARF) through
    // PyTorch's libraries, which costs far more per allocation.
    history_options_.stacks = when == CA::RecordContext::NEVER ? cachealloc::StackCapture::none : native_stacks_;
    // Where PyTorch gathers Python frames, ours records them as well, after
    // the native frames; room for both (unwound ones reach ~30 under libtorch).
    if (context_recorder != nullptr && when != CA::RecordContext::NEVER) {
      history_options_.stacks = cachealloc::with_interpreter_frames(history_options_.stacks);
      history_options_.max_frames = 96;
    }
    history_options_.stacks_on_free = when == CA::RecordContext::ALL;
    context_capacity_.store(std::max<std::size_t>(1, alloc_trace_max_entries), std::memory_order_relaxed);
    trace_max_entries_ = std::max<std::size_t>(1, alloc_trace_max_entries);
  }
  // torch_frames_ off (cachealloc.record(torch_frames=False)): our recorder
  // keeps its own Python frames, PyTorch's hook is never called, so
  // _snapshot() carries none and the hook's cost is saved.
  const bool frames = enabled && context_recorder != nullptr && when != CA::RecordContext::NEVER &&
                      torch_frames_.load(std::memory_order_relaxed);
  context_when_.store(frames ? static_cast<int>(when) : 0, std::memory_order_relaxed);
  context_recorder_.store(frames ? context_recorder : nullptr, std::memory_order_release);
  for (int d = 0; d < kMaxDevices; ++d) {
    DeviceState* s = states_[d].load(std::memory_order_acquire);
    if (s == nullptr) continue;
    if (enabled) {
      if (clear_history || !s->history->recording()) {
        start_history(*s);
        std::lock_guard contexts_lock(s->contexts.mutex);
        s->contexts.recent.clear();
      }
    } else {
      s->history->stop();
    }
  }
}

CA::SnapshotInfo TorchAllocator::snapshot(c10::MempoolId_t mempool_id, bool include_traces) {
  // {0, 0}: every segment; a pool's id: that pool's segments only (MemPool.snapshot()).
  const bool one_pool = mempool_id.first != 0 || mempool_id.second != 0;
  CA::SnapshotInfo info;
  info.device_traces.resize(static_cast<std::size_t>(std::max(device_count_, 1)));
  const cachealloc::AllocatorConfig* config = nullptr;
  for (int d = 0; d < device_count_; ++d) {
    DeviceState* s = existing(d);
    if (s == nullptr) continue;
    config = &s->allocator->config();
    // Segments as PyTorch lists them: an expandable segment is one segment
    // per mapped run, unmapped pages are not listed.
    std::vector<cachealloc::snapshot::Segment> layout;
    std::vector<cachealloc::snapshot::Event> events;
    const bool recorded = include_traces && s->history->recorded_events() > 0;
    cachealloc::snapshot::Snapshot taken;
    std::unordered_map<std::uintptr_t, std::shared_ptr<c10::GatheredContext>> live_contexts;
    std::deque<ContextRecord> recent_contexts;
    {
      std::lock_guard lock(s->contexts.mutex);
      live_contexts = s->contexts.live;
      recent_contexts = s->contexts.recent;
    }
    if (recorded) {
      taken = s->history->take_snapshot();
      layout = taken.segments;
    } else {
      layout = s->allocator->layout();
    }
    const std::map<std::uintptr_t, cachealloc::PrivatePoolId> owners = s->allocator->private_segments();
    for (const cachealloc::snapshot::Segment& segment : layout) {
      const auto owner = owners.find(segment.address);
      const cachealloc::PrivatePoolId pool = owner == owners.end() ? cachealloc::PrivatePoolId{} : owner->second;
      if (one_pool && pool != pool_id(mempool_id)) continue;
      CDA::SegmentInfo* current = nullptr;
      for (const cachealloc::snapshot::Block& block : segment.blocks) {
        if (block.state == BlockState::unmapped) {
          current = nullptr;
          continue;
        }
        if (current == nullptr) {
          info.segments.emplace_back();
          current = &info.segments.back();
          current->device = static_cast<c10::DeviceIndex>(d);
          current->address = block.address;
          current->stream = reinterpret_cast<void*>(segment.stream);
          current->is_large = segment.large_pool;
          current->is_expandable = segment.expandable;
          current->owner_private_pool_id = c10::MempoolId_t{pool.first, pool.second};
        }
        CDA::BlockInfo out;
        out.size = block.size;
        out.allocated = block.state == BlockState::active_allocated;
        out.active = out.allocated || block.state == BlockState::active_pending_free;
        out.requested_size = out.active ? block.requested : 0;
        if (out.active) {
          if (auto it = live_contexts.find(block.address); it != live_contexts.end())
            out.context_when_allocated = it->second;
        }
        current->total_size += block.size;
        if (out.allocated) current->allocated_size += block.size;
        if (out.active) {
          current->active_size += block.size;
          current->requested_size += out.requested_size;
        }
        current->blocks.push_back(std::move(out));
      }
    }
    if (!recorded) continue;
    // Our times are CLOCK_MONOTONIC; PyTorch's converter expects its
    // approximate clock, so each time is mapped through the line between the
    // two clocks at the start of recording and now.
    const std::uint64_t now_ns = monotonic_ns();
    const c10::approx_time_t now_approx = c10::getApproximateTime();
    const double span_ns = static_cast<double>(now_ns - s->start_ns);
    const double ratio =
        span_ns > 1e6 ? static_cast<double>(now_approx - s->start_approx) / span_ns : 1.0;
    auto approx = [&](std::uint64_t t) {
      const double delta = (static_cast<double>(t) - static_cast<double>(s->start_ns)) * ratio;
      return static_cast<c10::approx_time_t>(static_cast<double>(s->start_approx) + delta);
    };
    // Contexts to events: per address, the last allocations (and frees) of
    // the trace take the last contexts recorded for that address, in order
    // (both windows end now; the older one may reach further back).
    struct PerAddress {
      std::vector<std::shared_ptr<c10::GatheredContext>> allocs, frees;
      std::size_t trace_allocs = 0, trace_frees = 0, next_alloc = 0, next_free = 0;
      std::shared_ptr<c10::GatheredContext> last_alloc;
    };
    std::unordered_map<std::uintptr_t, PerAddress> by_address;
    for (ContextRecord& record : recent_contexts) {
      PerAddress& a = by_address[record.address];
      (record.is_free ? a.frees : a.allocs).push_back(std::move(record.context));
    }
    if (!by_address.empty()) {
      for (const cachealloc::snapshot::Event& event : taken.events) {
        auto it = by_address.find(event.address);
        if (it == by_address.end()) continue;
        if (event.kind == EventKind::alloc) ++it->second.trace_allocs;
        if (event.kind == EventKind::free_requested) ++it->second.trace_frees;
      }
      for (auto& [address, a] : by_address) {
        (void)address;
        // next_* < 0 in effect: the trace's first events have no context.
        a.next_alloc = a.allocs.size() - std::min(a.allocs.size(), a.trace_allocs);
        a.next_free = a.frees.size() - std::min(a.frees.size(), a.trace_frees);
      }
    }
    auto context_for = [&](const cachealloc::snapshot::Event& event) -> std::shared_ptr<c10::GatheredContext> {
      if (by_address.empty()) return nullptr;
      auto it = by_address.find(event.address);
      if (it == by_address.end()) return nullptr;
      PerAddress& a = it->second;
      if (event.kind == EventKind::alloc) {
        // Trace allocations before the contexts' window have none.
        if (a.trace_allocs > a.allocs.size()) {
          --a.trace_allocs;
          a.last_alloc = nullptr;
          return nullptr;
        }
        a.last_alloc = a.next_alloc < a.allocs.size() ? a.allocs[a.next_alloc++] : nullptr;
        return a.last_alloc;
      }
      if (event.kind == EventKind::free_requested && !a.frees.empty()) {
        if (a.trace_frees > a.frees.size()) {
          --a.trace_frees;
          return a.last_alloc;
        }
        return a.next_free < a.frees.size() ? a.frees[a.next_free++] : a.last_alloc;
      }
      return a.last_alloc;  // PyTorch: a free without its own context shows the allocation's
    };
    std::vector<CDA::TraceEntry>& trace = info.device_traces[static_cast<std::size_t>(d)];
    for (const cachealloc::snapshot::Event& event : taken.events) {
      CDA::TraceEntry::Action action{};
      std::size_t size = event.size;
      switch (event.kind) {
        case EventKind::alloc: action = CDA::TraceEntry::ALLOC; size = event.aux; break;
        case EventKind::free_requested: action = CDA::TraceEntry::FREE_REQUESTED; size = event.aux; break;
        case EventKind::free_completed: action = CDA::TraceEntry::FREE_COMPLETED; size = event.aux; break;
        case EventKind::segment_alloc: action = CDA::TraceEntry::SEGMENT_ALLOC; break;
        case EventKind::segment_release: action = CDA::TraceEntry::SEGMENT_FREE; break;
        case EventKind::segment_map: action = CDA::TraceEntry::SEGMENT_MAP; break;
        case EventKind::segment_unmap: action = CDA::TraceEntry::SEGMENT_UNMAP; break;
        case EventKind::oom: action = CDA::TraceEntry::OOM; break;
        case EventKind::annotation_begin:
        case EventKind::annotation_end: {
          CDA::AnnotationEntry annotation(static_cast<c10::DeviceIndex>(d), approx(event.time_ns));
          annotation.recordUserMetadata("stage", event.kind == EventKind::annotation_begin ? "START" : "END");
          annotation.recordUserMetadata("name", event.aux < taken.strings.size() ? taken.strings[event.aux] : "");
          info.external_annotations.push_back(std::move(annotation));
          continue;
        }
        default: continue;  // splits, merges, empty_cache: not in PyTorch's trace
      }
      const bool block_event = event.kind == EventKind::alloc || event.kind == EventKind::free_requested ||
                               event.kind == EventKind::free_completed;
      trace.emplace_back(action, static_cast<c10::DeviceIndex>(d), static_cast<std::size_t>(event.address), size,
                         reinterpret_cast<void*>(event.stream), c10::MempoolId_t{0, 0}, approx(event.time_ns),
                         block_event ? context_for(event) : nullptr);
    }
    // PyTorch's ring holds max_entries trace entries; ours counts splits and
    // merges too, so the trace is cut to the same window here.
    if (trace_max_entries_ > 0 && trace.size() > trace_max_entries_)
      trace.erase(trace.begin(), trace.end() - static_cast<std::ptrdiff_t>(trace_max_entries_));
  }
  if (config != nullptr) {
    info.config_metadata.garbage_collection_threshold = config->garbage_collection_threshold;
    info.config_metadata.max_split_size = config->max_split_size;
    info.config_metadata.expandable_segments = config->expandable_segments;
    info.config_metadata.last_allocator_settings = config->source;
    info.config_metadata.roundup_power2_divisions.assign(config->roundup_power2_divisions.begin(),
                                                         config->roundup_power2_divisions.end());
  }
  return info;
}

thread_local std::string t_error;

}  // namespace cachealloc::torch_bridge

using namespace cachealloc::torch_bridge;

extern "C" {

// Makes our allocator PyTorch's CUDA allocator. Must run before the first
// CUDA tensor. Returns 0, or -1 with cachealloc_torch_error() set.
__attribute__((visibility("default"))) int cachealloc_torch_install() {
  try {
    // Not owning: the allocator lives for the whole process.
    const std::shared_ptr<CA::CUDAAllocator> allocator(std::shared_ptr<CA::CUDAAllocator>{},
                                                       &TorchAllocator::instance());
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
#if CACHEALLOC_HAVE_PYTHON_FRAMES
    const cachealloc_frame_source python_frames = cachealloc::python::python_frame_source();
    cachealloc::set_frame_source(&python_frames);
#endif
    return 0;
  } catch (const std::exception& error) {
    t_error = error.what();
    return -1;
  }
}

__attribute__((visibility("default"))) const char* cachealloc_torch_error() { return t_error.c_str(); }

// The C++ stacks our recorder keeps from the next _record_memory_history on:
// "unwind" (through PyTorch's libraries; cachealloc.record()'s default),
// "native" (frame pointers only, which stop at PyTorch's first frame; the
// default here, or CACHEALLOC_TORCH_STACKS) or "none". Where
// _record_memory_history asks for frames, Python frames follow them (none:
// Python frames alone). Returns 0, or -1 for another value.
__attribute__((visibility("default"))) int cachealloc_torch_set_stacks(const char* capture) {
  try {
    TorchAllocator::instance().set_native_stacks(cachealloc::parse_stack_capture(capture == nullptr ? "" : capture));
    return 0;
  } catch (const std::exception& error) {
    t_error = error.what();
    return -1;
  }
}

// Whether PyTorch's own hook gathers frames for _snapshot() and
// _dump_snapshot() from the next _record_memory_history on (1, the default),
// or only our recorder keeps them, for our own dump (0).
__attribute__((visibility("default"))) void cachealloc_torch_set_torch_frames(int on) {
  TorchAllocator::instance().set_torch_frames(on != 0);
}

// Streams every device's recording to a file from the next
// _record_memory_history on (format version 7): "{device}" and "{pid}" in
// `path` become the device index and the process id. NULL or "": no stream.
// Returns 0, or -1 with cachealloc_torch_error() set.
__attribute__((visibility("default"))) int cachealloc_torch_set_stream(const char* path) {
  try {
    TorchAllocator::instance().set_stream(path == nullptr ? "" : path);
    return 0;
  } catch (const std::exception& error) {
    t_error = error.what();
    return -1;
  }
}

__attribute__((visibility("default"))) void cachealloc_torch_annotate(int begin, const char* name) {
  try {
    TorchAllocator::instance().annotate(begin != 0, name == nullptr ? "" : name);
  } catch (...) {
  }
}

// Records that the live allocation at `address` on `device` holds
// `category` ("parameter", "gradient", "optimizer_state", "activation", ...;
// the names cachealloc-analyze prints). Returns 0, or -1 with
// cachealloc_torch_error() set for an unknown name.
__attribute__((visibility("default"))) int cachealloc_torch_tag_category(int device, std::uint64_t address,
                                                                         const char* category) {
  cachealloc::events::AllocationCategory parsed{};
  if (category == nullptr || !cachealloc::events::parse_allocation_category(category, parsed)) {
    t_error = std::string("unknown category '") + (category == nullptr ? "" : category) + "'";
    return -1;
  }
  try {
    TorchAllocator::instance().tag_category(device, static_cast<std::uintptr_t>(address), parsed);
    return 0;
  } catch (const std::exception& error) {
    t_error = error.what();
    return -1;
  }
}

// Writes device `device`'s recording in our format, native stacks
// symbolized and Python frames named (for a pickle, cachealloc.dump calls torch's _dump_snapshot). Returns 0, or -1 with cachealloc_torch_error() set.
__attribute__((visibility("default"))) int cachealloc_torch_dump(int device, const char* path) {
  try {
    if (!TorchAllocator::instance().dump(device, path)) {
      t_error = "nothing recorded on device " + std::to_string(device) +
                " (call torch.cuda.memory._record_memory_history() or cachealloc.record() first), "
                "or the file could not be written";
      return -1;
    }
    return 0;
  } catch (const std::exception& error) {
    t_error = error.what();
    return -1;
  }
}

}  // extern "C"
