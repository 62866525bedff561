// NVML through dlopen (device.hpp, read_nvml_usage). The few types below
// are NVML's stable C ABI (nvml.h, API version 12), declared here so that no
// NVML header is needed to build and libnvidia-ml is never linked: a binary
// linked this way starts and runs on a machine with no driver.
//
// Cost: one reading is a handful of ioctls, 0.1-1 ms. It is taken at the
// dump and at an OOM only, never on the allocator's hot path.
#include <dlfcn.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "cachealloc/device.hpp"

namespace cachealloc {

namespace {

using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ull;

struct NvmlMemoryV1 {  // nvmlMemory_t
  unsigned long long total, free, used;
};
struct NvmlMemoryV2 {  // nvmlMemory_v2_t: used excludes reserved, as nvidia-smi prints it
  unsigned int version;
  unsigned long long total, reserved, free, used;
};
constexpr unsigned int kNvmlMemoryV2Version = static_cast<unsigned int>(sizeof(NvmlMemoryV2)) | (2u << 24);
struct NvmlProcessInfo {  // nvmlProcessInfo_v2_t, taken by ..._v2 and ..._v3
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

class NvmlLibrary {
 public:
  explicit NvmlLibrary(const char* library) {
    handle_ = ::dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      failure_ = std::string(library) + " not found (no NVIDIA driver on this machine?)";
      return;
    }
    init_ = find<NvmlReturn (*)()>("nvmlInit_v2");
    by_bus_id_ = find<NvmlReturn (*)(const char*, NvmlDevice*)>("nvmlDeviceGetHandleByPciBusId_v2");
    memory_v2_ = find<NvmlReturn (*)(NvmlDevice, NvmlMemoryV2*)>("nvmlDeviceGetMemoryInfo_v2");
    memory_v1_ = find<NvmlReturn (*)(NvmlDevice, NvmlMemoryV1*)>("nvmlDeviceGetMemoryInfo");
    processes_ = find<NvmlReturn (*)(NvmlDevice, unsigned*, NvmlProcessInfo*)>("nvmlDeviceGetComputeRunningProcesses_v3");
    if (!processes_)
      processes_ = find<NvmlReturn (*)(NvmlDevice, unsigned*, NvmlProcessInfo*)>("nvmlDeviceGetComputeRunningProcesses_v2");
    driver_version_ = find<NvmlReturn (*)(char*, unsigned)>("nvmlSystemGetDriverVersion");
    error_string_ = find<const char* (*)(NvmlReturn)>("nvmlErrorString");
    if (!init_ || !by_bus_id_ || (!memory_v2_ && !memory_v1_) || !processes_) {
      failure_ = std::string(library) + " lacks the NVML calls needed (nvmlInit_v2, ..._v2 memory and process queries)";
      return;
    }
    if (const NvmlReturn status = init_(); status != kNvmlSuccess) {
      failure_ = "nvmlInit_v2 failed: " + error(status);
      return;
    }
    initialized_ = true;
    char version[96] = {};
    if (driver_version_ && driver_version_(version, sizeof version) == kNvmlSuccess) driver_ = version;
  }
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;
  // nvmlShutdown is left out on purpose: the default library lives for the
  // process, and NVML reference-counts its init for the others.
  ~NvmlLibrary() {
    if (handle_ && !initialized_) ::dlclose(handle_);
  }

  DeviceUsage read(const std::string& pci_bus_id) const {
    DeviceUsage usage;
    if (!failure_.empty()) {
      usage.note = failure_;
      return usage;
    }
    NvmlDevice device = nullptr;
    if (const NvmlReturn status = by_bus_id_(pci_bus_id.c_str(), &device); status != kNvmlSuccess) {
      usage.note = "NVML has no device at PCI bus id " + pci_bus_id + ": " + error(status);
      return usage;
    }
    NvmlMemoryV2 memory{};
    memory.version = kNvmlMemoryV2Version;
    if (!memory_v2_ || memory_v2_(device, &memory) != kNvmlSuccess) {
      NvmlMemoryV1 v1{};
      if (const NvmlReturn status = memory_v1_ ? memory_v1_(device, &v1) : -1; status != kNvmlSuccess) {
        usage.note = "nvmlDeviceGetMemoryInfo failed: " + error(status);
        return usage;
      }
      memory = NvmlMemoryV2{kNvmlMemoryV2Version, v1.total, 0, v1.free, v1.used};
    }
    std::vector<NvmlProcessInfo> processes(64);
    unsigned count = static_cast<unsigned>(processes.size());
    NvmlReturn status = processes_(device, &count, processes.data());
    for (int attempt = 0; status == kNvmlInsufficientSize && attempt < 4; ++attempt) {
      processes.resize(count + 16);  // processes may start between the calls
      count = static_cast<unsigned>(processes.size());
      status = processes_(device, &count, processes.data());
    }
    if (status != kNvmlSuccess) {
      usage.note = "nvmlDeviceGetComputeRunningProcesses failed: " + error(status);
      return usage;
    }
    usage.source = DeviceUsage::Source::nvml;
    usage.note = driver_.empty() ? "driver version unknown" : "driver " + driver_;
    usage.device_total = memory.total;
    usage.device_used = memory.used;
    usage.device_reserved = memory.reserved;
    const auto pid = static_cast<unsigned>(::getpid());
    bool unreported = false;
    for (unsigned i = 0; i < count && i < processes.size(); ++i) {
      const NvmlProcessInfo& process = processes[i];
      const bool known = process.usedGpuMemory != kNvmlValueNotAvailable;
      if (process.pid == pid) {
        usage.process_found = known;
        if (known) usage.process_used = process.usedGpuMemory;
        else unreported = true;
      } else {
        ++usage.other_processes;
        if (known) usage.other_processes_used += process.usedGpuMemory;
      }
    }
    if (unreported) {
      usage.note += "; NVML does not report per-process memory here";
    } else if (!usage.process_found) {
      usage.note += "; pid " + std::to_string(pid) + " is not among NVML's " + std::to_string(count) +
                    " compute processes (another pid namespace?)";
    }
    return usage;
  }

 private:
  template <class F>
  F find(const char* symbol) const {
    return reinterpret_cast<F>(::dlsym(handle_, symbol));
  }
  std::string error(NvmlReturn status) const {
    const char* text = error_string_ ? error_string_(status) : nullptr;
    return text ? std::string(text) : "NVML error " + std::to_string(status);
  }

  void* handle_ = nullptr;
  bool initialized_ = false;
  std::string failure_;
  std::string driver_;
  NvmlReturn (*init_)() = nullptr;
  NvmlReturn (*by_bus_id_)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*memory_v2_)(NvmlDevice, NvmlMemoryV2*) = nullptr;
  NvmlReturn (*memory_v1_)(NvmlDevice, NvmlMemoryV1*) = nullptr;
  NvmlReturn (*processes_)(NvmlDevice, unsigned*, NvmlProcessInfo*) = nullptr;
  NvmlReturn (*driver_version_)(char*, unsigned) = nullptr;
  const char* (*error_string_)(NvmlReturn) = nullptr;
};

constexpr const char* kDefaultLibrary = "libnvidia-ml.so.1";

}  // namespace

DeviceUsage read_nvml_usage(const std::string& pci_bus_id, const char* library) noexcept {
  try {
    if (library == nullptr) library = kDefaultLibrary;
    if (std::strcmp(library, kDefaultLibrary) == 0) {
      static const NvmlLibrary nvml(kDefaultLibrary);  // thread-safe, once per process
      return nvml.read(pci_bus_id);
    }
    const NvmlLibrary nvml(library);
    return nvml.read(pci_bus_id);
  } catch (const std::exception& e) {
    DeviceUsage usage;
    try {
      usage.note = std::string("NVML could not be read: ") + e.what();
    } catch (...) {
    }
    return usage;
  } catch (...) {
    return DeviceUsage{};
  }
}

DeviceUsage Device::usage() noexcept {
  DeviceUsage usage;
  try {
    usage.note = std::string("the ") + backend() + " backend reads no NVML";
  } catch (...) {
  }
  return usage;
}

}  // namespace cachealloc
