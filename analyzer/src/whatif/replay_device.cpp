// PlacementDevice: the simulated device, with each reservation placed where
// the recording put it for as long as the replay reserves as it did.
#include "cachealloc/errors.hpp"
#include "whatif/replay_parts.hpp"

namespace cachealloc::analyzer::whatif {

namespace {

// Model-placed reservations sit above every recorded address (recorded ones
// are below 128 TiB, the simulated device's ranges below 192 TiB).
constexpr std::uintptr_t kModelOffset = std::uintptr_t{1} << 48;

}  // namespace

PlacementDevice::PlacementDevice(std::shared_ptr<Device> inner, Placement placement,
                                 std::vector<std::pair<std::uint64_t, std::uint64_t>> script)
    : ForwardingDevice(std::move(inner)), recorded_(placement == Placement::recorded), script_(std::move(script)) {}

void* PlacementDevice::reserve(std::size_t bytes) {
  void* inner = inner_->reserve(bytes);
  if (inner == nullptr) return nullptr;
  std::uintptr_t address = reinterpret_cast<std::uintptr_t>(inner);
  if (recorded_) {
    if (!diverged_ && next_ < script_.size() && script_[next_].second == bytes &&
        free_range(script_[next_].first, bytes)) {
      address = script_[next_++].first;
      ++placed_;
    } else {
      diverged_ = true;
      address += kModelOffset;
    }
    live_[address] = bytes;
    translate_[address] = reinterpret_cast<std::uintptr_t>(inner);
  }
  return reinterpret_cast<void*>(address);
}

void PlacementDevice::release(void* ptr, std::size_t bytes) {
  if (!recorded_) return inner_->release(ptr, bytes);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  const auto it = translate_.find(address);
  if (it == translate_.end()) throw DeviceError("replay: release of an address never reserved");
  inner_->release(reinterpret_cast<void*>(it->second), bytes);
  translate_.erase(it);
  live_.erase(address);
}

bool PlacementDevice::free_range(std::uint64_t address, std::uint64_t bytes) const {
  auto it = live_.lower_bound(address);
  if (it != live_.end() && it->first < address + bytes) return false;
  if (it != live_.begin()) {
    --it;
    if (it->first + it->second > address) return false;
  }
  return true;
}

}  // namespace cachealloc::analyzer::whatif
