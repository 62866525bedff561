// The one narrow interface between the allocator and a device.
//
// The allocator's policy never calls CUDA: it reserves and releases memory,
// records and queries events and asks for memory info through this interface.
// Two backends implement it: `cuda` (cudart) and `simulated` (a deterministic
// fake device for tests and machines without a GPU).
//
// Thread safety: every backend is safe to call from several threads at once.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cachealloc {

// An opaque stream handle. 0 is the device's default stream. For the cuda
// backend it is the cudaStream_t value.
struct Stream {
  std::uintptr_t handle = 0;
  friend auto operator<=>(Stream, Stream) = default;
};

// An opaque event handle owned by the backend that created it.
struct DeviceEvent {
  std::uintptr_t handle = 0;
};

struct MemoryInfo {
  std::size_t free = 0;   // bytes the driver can still hand out
  std::size_t total = 0;  // device capacity
};

// What nvidia-smi shows, read from NVML (libnvidia-ml.so.1) at one moment:
// this process's device memory (`nvidia-smi --query-compute-apps=pid,used_memory`)
// and the whole device's (`--query-gpu=memory.used,memory.total`).
struct DeviceUsage {
  enum class Source { unavailable, nvml, simulated };
  Source source = Source::unavailable;
  // nvml: "driver <version>"; unavailable: why, in one line (e.g.
  // "libnvidia-ml.so.1 not found"); the figures below are then unknown.
  std::string note;
  bool process_found = false;             // this pid was among the device's compute processes
  std::uint64_t process_used = 0;         // its device memory, valid when process_found
  std::uint64_t device_used = 0;          // memory.used (excludes device_reserved)
  std::uint64_t device_reserved = 0;      // memory.reserved (driver and firmware), 0 when not reported
  std::uint64_t device_total = 0;         // memory.total
  std::uint32_t other_processes = 0;      // other compute processes on the device
  std::uint64_t other_processes_used = 0; // their device memory, summed
};

// Reads NVML for the device at `pci_bus_id` (as cudaDeviceGetPCIBusId
// writes it), loading `library` with dlopen: never linked, so a binary
// starts on a machine without a driver. Never throws; on any failure the
// result's source is unavailable and its note says why. The default library
// is loaded and initialized once per process; thread-safe.
DeviceUsage read_nvml_usage(const std::string& pci_bus_id, const char* library = "libnvidia-ml.so.1") noexcept;

class Device {
 public:
  virtual ~Device() = default;

  // "cuda" or "simulated".
  virtual const char* backend() const noexcept = 0;
  // Marketing name, e.g. "NVIDIA H200".
  virtual std::string name() const = 0;
  virtual int index() const noexcept = 0;
  // The driver's view (cudaMemGetInfo). Throws DeviceError.
  virtual MemoryInfo memory_info() = 0;
  // NVML's view of this process and the device (DeviceUsage). Never throws.
  // The default says the backend has none.
  virtual DeviceUsage usage() noexcept;

  // Reserves `bytes` of device memory (cudaMalloc). Returns nullptr when the
  // device is out of memory; throws DeviceError on any other failure.
  virtual void* reserve(std::size_t bytes) = 0;
  // Returns memory from reserve(). Throws DeviceError.
  virtual void release(void* ptr, std::size_t bytes) = 0;

  // Virtual-memory calls behind expandable segments (cuMemAddressReserve,
  // cuMemCreate + cuMemMap). Memory is mapped in handles of `chunk` bytes so
  // that any chunk can later be unmapped on its own.
  virtual bool supports_virtual_memory() noexcept { return false; }
  // Reserves an address range with no memory behind it. Throws DeviceError.
  virtual void* reserve_address_range(std::size_t bytes) = 0;
  virtual void release_address_range(void* ptr, std::size_t bytes) = 0;
  // Backs [ptr, ptr + bytes) with memory, `chunk` bytes per handle. Returns
  // false, having mapped nothing, when the device is out of memory.
  virtual bool map(void* ptr, std::size_t bytes, std::size_t chunk) = 0;
  virtual void unmap(void* ptr, std::size_t bytes, std::size_t chunk) = 0;

  virtual Stream create_stream() = 0;
  virtual void destroy_stream(Stream stream) noexcept = 0;
  virtual void synchronize_stream(Stream stream) = 0;
  // Waits for all work on every stream.
  virtual void synchronize() = 0;

  virtual DeviceEvent create_event() = 0;
  virtual void destroy_event(DeviceEvent event) noexcept = 0;
  // Records `event` at the current end of `stream`'s work.
  virtual void record_event(DeviceEvent event, Stream stream) = 0;
  // True once all work before the record has completed.
  virtual bool query_event(DeviceEvent event) = 0;
  virtual void synchronize_event(DeviceEvent event) = 0;
};

// Under a real memory limit, cudaMalloc(S) fails unless S plus this much is
// free (cudaMemGetInfo): measured between 1.125 and 3.125 MiB on an H200.
// Not an address rule, and the simulated device's capacity does not apply
// it; a replay of a sequence recorded under a limit adds it to the memory
// held from the start.
inline constexpr std::size_t kDriverFreeMemoryKept = std::size_t{2} << 20;

struct SimulatedDeviceOptions {
  // An H200 as cudaMemGetInfo reports it: 139.8 GiB.
  std::size_t capacity = 150109880320ull;
  // Bytes this process's CUDA context holds from the start (module and
  // kernel images, the driver's own allocations), so that free < total and
  // the process uses more than the allocator reserves, as on a real device.
  std::size_t context_overhead = 0;
  // Device memory held by other processes: nvidia-smi's whole-device figure
  // less this process's, which cudaMemGetInfo's free also leaves out.
  std::size_t other_processes_bytes = 0;
  std::uint32_t other_processes = 0;
  // Memory the driver and firmware reserve (nvidia-smi memory.reserved):
  // outside `capacity`, which is cudaMemGetInfo's total, and inside NVML's.
  std::size_t driver_reserved = 0;
  // When true, events complete as soon as they are recorded. When false, an
  // event completes only when its stream (or the device) is synchronized,
  // so cross-stream deferral is observable in tests.
  bool events_complete_immediately = false;
  std::string name = "simulated";
  // reserve() places memory where the CUDA driver's cudaMalloc does, by the
  // driver address model (measured on an NVIDIA H200, driver 580.159.04,
  // CUDA 13.0; recorder/allocator/src/devices/driver_address_model.hpp has the rules
  // and their constants). PyTorch's best fit breaks ties between equal-sized
  // cached blocks by address, so these addresses make the allocator reuse
  // the blocks a real device's would. `base_address` is the model's base B
  // (32 MiB aligned, else the constructor throws InvalidArgument): the CUDA
  // context's chunks sit at [B, B+32 MiB) and [B+96, B+128 MiB), a fresh
  // device's first reservation lands at B+30 MiB and new chunks go below
  // B-384 MiB. Expandable segments' address ranges (reserve_address_range)
  // are not cudaMalloc and come from a separate first-fit range above.
  std::uintptr_t base_address = 0x7f0000000000ull;
  // An override of the model: addresses for the first reservations, in
  // order, as a real device handed them out (see cachealloc-conformance
  // --record-addresses). A scripted address that is not free, and every
  // reservation after the script, falls back to first fit from base_address.
  std::vector<std::uintptr_t> address_script;
};

// A device that forwards every call to another one: derive and override
// what you change (the conformance tool's address recorder, the analyzer's
// replay placement).
class ForwardingDevice : public Device {
 public:
  explicit ForwardingDevice(std::shared_ptr<Device> inner) : inner_(std::move(inner)) {}
  const char* backend() const noexcept override { return inner_->backend(); }
  std::string name() const override { return inner_->name(); }
  int index() const noexcept override { return inner_->index(); }
  MemoryInfo memory_info() override { return inner_->memory_info(); }
  DeviceUsage usage() noexcept override { return inner_->usage(); }
  void* reserve(std::size_t bytes) override { return inner_->reserve(bytes); }
  void release(void* ptr, std::size_t bytes) override { inner_->release(ptr, bytes); }
  bool supports_virtual_memory() noexcept override { return inner_->supports_virtual_memory(); }
  void* reserve_address_range(std::size_t bytes) override { return inner_->reserve_address_range(bytes); }
  void release_address_range(void* ptr, std::size_t bytes) override { inner_->release_address_range(ptr, bytes); }
  bool map(void* ptr, std::size_t bytes, std::size_t chunk) override { return inner_->map(ptr, bytes, chunk); }
  void unmap(void* ptr, std::size_t bytes, std::size_t chunk) override { inner_->unmap(ptr, bytes, chunk); }
  Stream create_stream() override { return inner_->create_stream(); }
  void destroy_stream(Stream stream) noexcept override { inner_->destroy_stream(stream); }
  void synchronize_stream(Stream stream) override { inner_->synchronize_stream(stream); }
  void synchronize() override { inner_->synchronize(); }
  DeviceEvent create_event() override { return inner_->create_event(); }
  void destroy_event(DeviceEvent event) noexcept override { inner_->destroy_event(event); }
  void record_event(DeviceEvent event, Stream stream) override { inner_->record_event(event, stream); }
  bool query_event(DeviceEvent event) override { return inner_->query_event(event); }
  void synchronize_event(DeviceEvent event) override { inner_->synchronize_event(event); }

 protected:
  std::shared_ptr<Device> inner_;
};

std::shared_ptr<Device> make_simulated_device(const SimulatedDeviceOptions& options = {});
// An H200 as measured (driver 580.159.04, CUDA 13.0; docs/VERIFICATION.md,
// "NVML's figures against nvidia-smi"): cudaMemGetInfo's total, the CUDA context of a process that
// loads only cudart (518 MiB) and the driver's reservation (615.06 MiB).
SimulatedDeviceOptions simulated_h200_options();
// Parses the simulated device's settings, "key=value,..." with keys
// capacity, context, driver_reserved, other_processes_bytes (sizes such as
// 512MiB) and other_processes (a count), over simulated_h200_options(); an
// empty text gives those. Throws InvalidArgument naming the bad item.
// make_device() reads it from CACHEALLOC_SIMULATED, e.g.
// CACHEALLOC_SIMULATED=context=1GiB,other_processes=1,other_processes_bytes=20GiB.
SimulatedDeviceOptions simulated_options_from_text(const std::string& text);

// True when this build includes the cuda backend.
bool cuda_backend_built() noexcept;
// Number of CUDA devices visible; 0 when there is no driver or no device.
int cuda_device_count() noexcept;
// The calling thread's current CUDA device (cudaGetDevice), 0 when unknown.
int cuda_current_device() noexcept;
// Throws DeviceError("no CUDA device ...") when there is none, or when the
// backend was not built.
std::shared_ptr<Device> make_cuda_device(int index = 0);
// Takes about `bytes` of CUDA device `index`'s memory (rounded down to the
// driver's allocation granularity) until the result is dropped: physical
// memory with no address (cuMemCreate, never mapped), so cudaMalloc meets a
// real memory limit while the address space stays as it was. For tests that
// need cudaMalloc to fail for lack of memory. Throws DeviceError when the
// memory cannot be had or there is no cuda backend.
std::shared_ptr<void> hold_cuda_memory(int index, std::size_t bytes);

enum class DeviceChoice { automatic, cuda, simulated };
// Parses "auto", "cuda" or "simulated". Throws InvalidArgument naming the value.
DeviceChoice parse_device_choice(const std::string& text);
// cuda when a device is present (for automatic), else simulated. The cuda
// device is the calling thread's current one (torch.cuda.set_device), as
// PyTorch does. Reads CACHEALLOC_DEVICE when `choice` is not given.
std::shared_ptr<Device> make_device(DeviceChoice choice);
std::shared_ptr<Device> make_device_from_environment();

}  // namespace cachealloc
