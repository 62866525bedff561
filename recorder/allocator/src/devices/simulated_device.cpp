// A deterministic fake device: reservations are placed by the driver address
// model (driver_address_model.hpp), or by a recorded address script when one
// is given; capacity is enforced like cudaMalloc's, and events complete when
// their stream is synchronized. Nothing here touches a GPU.
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "cachealloc/device.hpp"
#include "cachealloc/errors.hpp"
#include "devices/driver_address_model.hpp"

namespace cachealloc {
namespace {

constexpr std::size_t kAlignment = 512;
// Ordinary reservations live in [4 GiB, 128 TiB), where the driver address
// model and addresses recorded on a real device fit; expandable segments'
// ranges above that, apart from both.
constexpr std::uintptr_t kSpaceStart = std::uintptr_t{1} << 32;
constexpr std::uintptr_t kVirtualStart = std::uintptr_t{128} << 40;
constexpr std::size_t kVirtualSize = std::size_t{64} << 40;

// First-fit allocation of address ranges; lowest address wins, so the same
// sequence of calls always yields the same addresses. Serves expandable
// segments' address ranges, and reservations under an address script.
class AddressSpace {
 public:
  // Manages [start, start + size); first fit searches from `first_fit_from`.
  AddressSpace(std::uintptr_t start, std::size_t size, std::uintptr_t first_fit_from)
      : first_fit_from_(first_fit_from) {
    free_[start] = size;
  }

  // Takes exactly [address, address + bytes) if it is free.
  bool take_at(std::uintptr_t address, std::size_t bytes) {
    auto it = free_.upper_bound(address);
    if (it == free_.begin()) return false;
    --it;
    const std::uintptr_t start = it->first;
    const std::size_t length = it->second;
    if (address + bytes > start + length) return false;
    free_.erase(it);
    if (address > start) free_[start] = address - start;
    if (start + length > address + bytes) free_[address + bytes] = start + length - (address + bytes);
    return true;
  }

  std::uintptr_t take(std::size_t bytes) {
    auto it = free_.upper_bound(first_fit_from_);
    if (it != free_.begin()) --it;
    for (; it != free_.end(); ++it) {
      const std::uintptr_t address = std::max(it->first, first_fit_from_);
      const std::size_t usable = it->first + it->second - std::min(address, it->first + it->second);
      if (usable < bytes) continue;
      if (address != it->first) {
        take_at(address, bytes);
        return address;
      }
      const std::size_t left = it->second - bytes;
      free_.erase(it);
      if (left) free_[address + bytes] = left;
      return address;
    }
    return 0;
  }

  void give_back(std::uintptr_t address, std::size_t bytes) {
    auto next = free_.lower_bound(address);
    if (next != free_.end() && next->first == address + bytes) {
      bytes += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == address) {
        prev->second += bytes;
        return;
      }
    }
    free_[address] = bytes;
  }

 private:
  std::uintptr_t first_fit_from_;
  std::map<std::uintptr_t, std::size_t> free_;
};

class SimulatedDevice final : public Device {
 public:
  explicit SimulatedDevice(const SimulatedDeviceOptions& options)
      : options_(options),
        addresses_(kSpaceStart, kVirtualStart - kSpaceStart, options.base_address),
        driver_(make_driver_model(options)),
        virtual_addresses_(kVirtualStart, kVirtualSize, kVirtualStart),
        used_(options.context_overhead) {
    if (options.context_overhead > options.capacity ||
        options.other_processes_bytes > options.capacity - options.context_overhead)
      throw InvalidArgument("simulated device: context overhead and other processes exceed capacity");
    used_ += options.other_processes_bytes;  // other processes' memory is not free for us either
    streams_[0] = {};
  }

  const char* backend() const noexcept override { return "simulated"; }
  std::string name() const override { return options_.name; }
  int index() const noexcept override { return 0; }

  MemoryInfo memory_info() override {
    std::lock_guard lock(mutex_);
    return {options_.capacity - used_, options_.capacity};
  }

  // NVML's figures on a real device, modelled: this process holds its
  // context plus every reservation and mapping (the allocator's and any
  // other caller's of reserve()), the device adds the other processes.
  DeviceUsage usage() noexcept override {
    std::lock_guard lock(mutex_);
    DeviceUsage usage;
    usage.source = DeviceUsage::Source::simulated;
    usage.process_found = true;
    usage.process_used = used_ - options_.other_processes_bytes;
    usage.device_used = used_;
    usage.device_total = options_.capacity + options_.driver_reserved;
    usage.device_reserved = options_.driver_reserved;
    usage.other_processes = options_.other_processes;
    usage.other_processes_used = options_.other_processes_bytes;
    return usage;
  }

  void* reserve(std::size_t bytes) override {
    if (bytes == 0) throw DeviceError("simulated device: reserve of 0 bytes");
    bytes = round_up(bytes);
    std::lock_guard lock(mutex_);
    if (bytes > options_.capacity - used_) return nullptr;
    std::uintptr_t address = 0;
    if (driver_) {
      address = driver_->allocate(bytes);
    } else {
      if (next_scripted_ < options_.address_script.size()) {
        const std::uintptr_t wanted = options_.address_script[next_scripted_++];
        if (wanted % kAlignment == 0 && addresses_.take_at(wanted, bytes)) address = wanted;
      }
      if (!address) address = addresses_.take(bytes);
    }
    if (!address) return nullptr;
    used_ += bytes;
    reservations_[address] = bytes;
    return reinterpret_cast<void*>(address);
  }

  void release(void* ptr, std::size_t /*bytes*/) override {
    std::lock_guard lock(mutex_);
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    auto it = reservations_.find(address);
    if (it == reservations_.end()) throw DeviceError("simulated device: release of an address it never reserved");
    used_ -= it->second;
    if (driver_) driver_->free(address);
    else addresses_.give_back(address, it->second);
    reservations_.erase(it);
  }

  bool supports_virtual_memory() noexcept override { return true; }

  void* reserve_address_range(std::size_t bytes) override {
    std::lock_guard lock(mutex_);
    return reinterpret_cast<void*>(virtual_addresses_.take(round_up(bytes)));
  }
  void release_address_range(void* ptr, std::size_t bytes) override {
    std::lock_guard lock(mutex_);
    virtual_addresses_.give_back(reinterpret_cast<std::uintptr_t>(ptr), round_up(bytes));
  }
  bool map(void* /*ptr*/, std::size_t bytes, std::size_t /*chunk*/) override {
    std::lock_guard lock(mutex_);
    if (bytes > options_.capacity - used_) return false;
    used_ += bytes;
    return true;
  }
  void unmap(void* /*ptr*/, std::size_t bytes, std::size_t /*chunk*/) override {
    std::lock_guard lock(mutex_);
    used_ -= bytes;
  }

  Stream create_stream() override {
    std::lock_guard lock(mutex_);
    const Stream stream{next_stream_++};
    streams_[stream.handle] = {};
    return stream;
  }
  void destroy_stream(Stream stream) noexcept override {
    std::lock_guard lock(mutex_);
    if (stream.handle != 0) streams_.erase(stream.handle);
  }
  void synchronize_stream(Stream stream) override {
    std::lock_guard lock(mutex_);
    auto& state = stream_state(stream);
    state.completed = state.recorded;
  }
  void synchronize() override {
    std::lock_guard lock(mutex_);
    for (auto& [handle, state] : streams_) state.completed = state.recorded;
  }

  DeviceEvent create_event() override {
    std::lock_guard lock(mutex_);
    const DeviceEvent event{next_event_++};
    events_[event.handle] = {};
    return event;
  }
  void destroy_event(DeviceEvent event) noexcept override {
    std::lock_guard lock(mutex_);
    events_.erase(event.handle);
  }
  void record_event(DeviceEvent event, Stream stream) override {
    std::lock_guard lock(mutex_);
    auto& state = stream_state(stream);
    events_.at(event.handle) = {stream.handle, ++state.recorded};
  }
  bool query_event(DeviceEvent event) override {
    if (options_.events_complete_immediately) return true;
    std::lock_guard lock(mutex_);
    const auto& recorded = event_state(event);
    if (recorded.ticket == 0) return true;  // never recorded: complete, as in CUDA
    auto it = streams_.find(recorded.stream);
    return it == streams_.end() || it->second.completed >= recorded.ticket;
  }
  void synchronize_event(DeviceEvent event) override {
    std::lock_guard lock(mutex_);
    const auto& recorded = event_state(event);
    auto it = streams_.find(recorded.stream);
    if (it != streams_.end() && it->second.completed < recorded.ticket) it->second.completed = recorded.ticket;
  }

 private:
  struct StreamState {
    std::uint64_t recorded = 0;   // tickets handed out by record_event
    std::uint64_t completed = 0;  // tickets known complete
  };
  struct EventState {
    std::uintptr_t stream = 0;
    std::uint64_t ticket = 0;
  };

  static std::size_t round_up(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

  // The driver address model unless an address script replaces it.
  static std::optional<detail::DriverAddressModel> make_driver_model(const SimulatedDeviceOptions& options) {
    if (!options.address_script.empty()) return std::nullopt;
    return detail::DriverAddressModel(options.base_address, kSpaceStart, kVirtualStart);
  }

  StreamState& stream_state(Stream stream) {
    auto it = streams_.find(stream.handle);
    if (it == streams_.end()) throw DeviceError("simulated device: unknown stream");
    return it->second;
  }
  const EventState& event_state(DeviceEvent event) {
    auto it = events_.find(event.handle);
    if (it == events_.end()) throw DeviceError("simulated device: unknown event");
    return it->second;
  }

  SimulatedDeviceOptions options_;
  std::mutex mutex_;
  AddressSpace addresses_;                            // under an address script
  std::optional<detail::DriverAddressModel> driver_;  // otherwise
  AddressSpace virtual_addresses_;
  std::size_t used_;
  std::unordered_map<std::uintptr_t, std::size_t> reservations_;
  std::map<std::uintptr_t, StreamState> streams_;
  std::unordered_map<std::uintptr_t, EventState> events_;
  std::uintptr_t next_stream_ = 1;
  std::uintptr_t next_event_ = 1;
  std::size_t next_scripted_ = 0;
};

}  // namespace

std::shared_ptr<Device> make_simulated_device(const SimulatedDeviceOptions& options) {
  return std::make_shared<SimulatedDevice>(options);
}

}  // namespace cachealloc
