// The cuda backend: cudart only. We never link libcuda, so a binary built
// with this backend still starts on a machine without a driver; there
// cudaGetDeviceCount fails and we report "no CUDA device".
#include <cuda.h>  // driver API types only; the functions come from cudaGetDriverEntryPointByVersion
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cachealloc/device.hpp"
#include "cachealloc/errors.hpp"

// Every CUDA call goes through this: the error carries file, line, the call
// and CUDA's own message.
#define CACHEALLOC_CUDA_TRY(call)                                                                  \
  do {                                                                                             \
    const cudaError_t cachealloc_status_ = (call);                                                 \
    if (cachealloc_status_ != cudaSuccess)                                                         \
      ::cachealloc::detail::throw_cuda_error(cachealloc_status_, #call, __FILE__, __LINE__);      \
  } while (0)

namespace cachealloc {
namespace detail {
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // clear the sticky-free error state
  throw DeviceError(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " +
                    cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}
}  // namespace detail

namespace {

// Makes `index` the calling thread's device for the scope, restoring the old one.
// cudaStreamCaptureModeRelaxed on this thread for the guard's life, so that
// cudaMalloc and cudaFree work while a stream captures a graph in global mode
// (PyTorch's cudaMallocMaybeCapturing). Costs one cheap driver call each way.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() noexcept {
    if (cudaThreadExchangeStreamCaptureMode(&mode_) != cudaSuccess) {
      (void)cudaGetLastError();
      active_ = false;
    }
  }
  ~RelaxedCaptureMode() {
    if (active_) (void)cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool active_ = true;
};

class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    CACHEALLOC_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ != index) CACHEALLOC_CUDA_TRY(cudaSetDevice(index));
    else previous_ = -1;
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Driver virtual-memory entry points, looked up through cudart so that we
// never link libcuda (a binary linked to it would not start without a driver).
struct DriverApi {
  CUresult (*mem_address_reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*mem_address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*mem_create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*mem_release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*mem_unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;

  template <typename F>
  static void load(const char* symbol, F& function) {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CACHEALLOC_CUDA_TRY(cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !address)
      throw DeviceError(std::string("driver entry point ") + symbol + " not found");
    function = reinterpret_cast<F>(address);
  }

  DriverApi() {
    load("cuMemAddressReserve", mem_address_reserve);
    load("cuMemAddressFree", mem_address_free);
    load("cuMemCreate", mem_create);
    load("cuMemRelease", mem_release);
    load("cuMemMap", mem_map);
    load("cuMemUnmap", mem_unmap);
    load("cuMemSetAccess", mem_set_access);
    load("cuGetErrorString", get_error_string);
  }

  void check(CUresult status, const char* call, const char* file, int line) const {
    if (status == CUDA_SUCCESS) return;
    const char* text = "unknown error";
    if (get_error_string) (void)get_error_string(status, &text);
    throw DeviceError(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " + text);
  }
};
#define CACHEALLOC_CU_TRY(api, call) (api).check((call), #call, __FILE__, __LINE__)

cudaStream_t to_cuda(Stream stream) { return reinterpret_cast<cudaStream_t>(stream.handle); }
cudaEvent_t to_cuda(DeviceEvent event) { return reinterpret_cast<cudaEvent_t>(event.handle); }

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index) : index_(index) {
    DeviceGuard guard(index_);
    cudaDeviceProp properties{};
    CACHEALLOC_CUDA_TRY(cudaGetDeviceProperties(&properties, index_));
    name_ = properties.name;
    char bus_id[64] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, index_) == cudaSuccess) bus_id_ = bus_id;
    else (void)cudaGetLastError();
  }

  const char* backend() const noexcept override { return "cuda"; }
  std::string name() const override { return name_; }
  int index() const noexcept override { return index_; }

  MemoryInfo memory_info() override {
    DeviceGuard guard(index_);
    MemoryInfo info;
    CACHEALLOC_CUDA_TRY(cudaMemGetInfo(&info.free, &info.total));
    return info;
  }

  // NVML finds the device by PCI bus id: CUDA's and NVML's indices differ
  // under CUDA_VISIBLE_DEVICES.
  DeviceUsage usage() noexcept override {
    if (bus_id_.empty()) {
      DeviceUsage usage;
      usage.note = "cudaDeviceGetPCIBusId failed, so NVML cannot find this device";
      return usage;
    }
    return read_nvml_usage(bus_id_);
  }

  void* reserve(std::size_t bytes) override {
    DeviceGuard guard(index_);
    // During a CUDA graph capture in global mode cudaMalloc is refused; as
    // PyTorch does, this thread relaxes the mode for the call.
    RelaxedCaptureMode relaxed;
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // out of memory is an answer, not a sticky error
      return nullptr;
    }
    CACHEALLOC_CUDA_TRY(status);
    return ptr;
  }

  void release(void* ptr, std::size_t /*bytes*/) override {
    DeviceGuard guard(index_);
    RelaxedCaptureMode relaxed;
    CACHEALLOC_CUDA_TRY(cudaFree(ptr));
  }

  bool supports_virtual_memory() noexcept override { return true; }

  void* reserve_address_range(std::size_t bytes) override {
    const DriverApi& api = driver();
    CUdeviceptr ptr = 0;
    CACHEALLOC_CU_TRY(api, api.mem_address_reserve(&ptr, bytes, 0, 0, 0));
    return reinterpret_cast<void*>(ptr);
  }
  void release_address_range(void* ptr, std::size_t bytes) override {
    const DriverApi& api = driver();
    CACHEALLOC_CU_TRY(api, api.mem_address_free(reinterpret_cast<CUdeviceptr>(ptr), bytes));
  }

  bool map(void* ptr, std::size_t bytes, std::size_t chunk) override {
    const DriverApi& api = driver();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = index_;
    const auto base = reinterpret_cast<CUdeviceptr>(ptr);
    std::vector<CUmemGenericAllocationHandle> created;
    for (std::size_t offset = 0; offset < bytes; offset += chunk) {
      CUmemGenericAllocationHandle handle = 0;
      const CUresult status = api.mem_create(&handle, chunk, &prop, 0);
      if (status == CUDA_ERROR_OUT_OF_MEMORY) {
        for (auto h : created) (void)api.mem_release(h);
        return false;
      }
      CACHEALLOC_CU_TRY(api, status);
      created.push_back(handle);
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    std::lock_guard lock(handles_mutex_);
    for (std::size_t i = 0; i < created.size(); ++i) {
      const CUdeviceptr at = base + i * chunk;
      CACHEALLOC_CU_TRY(api, api.mem_map(at, chunk, 0, created[i], 0));
      handles_[at] = created[i];
    }
    CACHEALLOC_CU_TRY(api, api.mem_set_access(base, bytes, &access, 1));
    return true;
  }

  void unmap(void* ptr, std::size_t bytes, std::size_t chunk) override {
    const DriverApi& api = driver();
    // Memory may still be in use by queued work until the device is idle.
    synchronize();
    const auto base = reinterpret_cast<CUdeviceptr>(ptr);
    CACHEALLOC_CU_TRY(api, api.mem_unmap(base, bytes));
    std::lock_guard lock(handles_mutex_);
    for (CUdeviceptr at = base; at < base + bytes; at += chunk) {
      auto it = handles_.find(at);
      if (it == handles_.end()) throw DeviceError("unmap of a range that was not mapped");
      CACHEALLOC_CU_TRY(api, api.mem_release(it->second));
      handles_.erase(it);
    }
  }

  Stream create_stream() override {
    DeviceGuard guard(index_);
    cudaStream_t stream = nullptr;
    CACHEALLOC_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return Stream{reinterpret_cast<std::uintptr_t>(stream)};
  }
  void destroy_stream(Stream stream) noexcept override {
    if (stream.handle) (void)cudaStreamDestroy(to_cuda(stream));
  }
  void synchronize_stream(Stream stream) override {
    DeviceGuard guard(index_);
    CACHEALLOC_CUDA_TRY(cudaStreamSynchronize(to_cuda(stream)));
  }
  void synchronize() override {
    DeviceGuard guard(index_);
    CACHEALLOC_CUDA_TRY(cudaDeviceSynchronize());
  }

  DeviceEvent create_event() override {
    DeviceGuard guard(index_);
    cudaEvent_t event = nullptr;
    CACHEALLOC_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return DeviceEvent{reinterpret_cast<std::uintptr_t>(event)};
  }
  void destroy_event(DeviceEvent event) noexcept override { (void)cudaEventDestroy(to_cuda(event)); }
  void record_event(DeviceEvent event, Stream stream) override {
    DeviceGuard guard(index_);
    CACHEALLOC_CUDA_TRY(cudaEventRecord(to_cuda(event), to_cuda(stream)));
  }
  bool query_event(DeviceEvent event) override {
    const cudaError_t status = cudaEventQuery(to_cuda(event));
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    CACHEALLOC_CUDA_TRY(status);
    return true;
  }
  void synchronize_event(DeviceEvent event) override { CACHEALLOC_CUDA_TRY(cudaEventSynchronize(to_cuda(event))); }

 private:
  static const DriverApi& driver() {
    static const DriverApi api;
    return api;
  }

  int index_;
  std::string name_;
  std::string bus_id_;  // "0000:19:00.0", for NVML
  std::mutex handles_mutex_;
  std::map<CUdeviceptr, CUmemGenericAllocationHandle> handles_;
};

}  // namespace

bool cuda_backend_built() noexcept { return true; }

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

int cuda_current_device() noexcept {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return device;
}

std::shared_ptr<Device> make_cuda_device(int index) {
  const int count = cuda_device_count();
  if (count == 0) throw DeviceError("no CUDA device: the driver reports none (or no driver is installed)");
  if (index < 0 || index >= count)
    throw DeviceError("no CUDA device " + std::to_string(index) + ": " + std::to_string(count) + " present");
  return std::make_shared<CudaDevice>(index);
}

}  // namespace cachealloc
