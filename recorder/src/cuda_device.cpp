// The cuda backend: cudart only. We never link libcuda, so a binary built
// with this backend still starts on a machine without a driver; there
// cudaGetDeviceCount fails and we report "no CUDA device".
#include <cuda_runtime_api.h>

#include <string>

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

cudaStream_t to_cuda(Stream stream) { return reinterpret_cast<cudaStream_t>(stream.handle); }
cudaEvent_t to_cuda(DeviceEvent event) { return reinterpret_cast<cudaEvent_t>(event.handle); }

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index) : index_(index) {
    DeviceGuard guard(index_);
    cudaDeviceProp properties{};
    CACHEALLOC_CUDA_TRY(cudaGetDeviceProperties(&properties, index_));
    name_ = properties.name;
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

  void* reserve(std::size_t bytes) override {
    DeviceGuard guard(index_);
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
    CACHEALLOC_CUDA_TRY(cudaFree(ptr));
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
  int index_;
  std::string name_;
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

std::shared_ptr<Device> make_cuda_device(int index) {
  const int count = cuda_device_count();
  if (count == 0) throw DeviceError("no CUDA device: the driver reports none (or no driver is installed)");
  if (index < 0 || index >= count)
    throw DeviceError("no CUDA device " + std::to_string(index) + ": " + std::to_string(count) + " present");
  return std::make_shared<CudaDevice>(index);
}

}  // namespace cachealloc
