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

void PlacementDevice::hold_events_on(Stream stream) { held_streams_.emplace(stream.handle, DeviceEvent{}); }

DeviceEvent PlacementDevice::last_held_event(Stream stream) const {
  const auto it = held_streams_.find(stream.handle);
  return it == held_streams_.end() ? DeviceEvent{} : it->second;
}

void PlacementDevice::complete_event(DeviceEvent event) {
  if (const auto it = held_events_.find(event.handle); it != held_events_.end()) it->second = true;
}

void PlacementDevice::record_event(DeviceEvent event, Stream stream) {
  if (const auto it = held_streams_.find(stream.handle); it != held_streams_.end()) {
    it->second = event;
    held_events_[event.handle] = false;
    return;
  }
  held_events_.erase(event.handle);
  inner_->record_event(event, stream);
}

bool PlacementDevice::query_event(DeviceEvent event) {
  if (const auto it = held_events_.find(event.handle); it != held_events_.end()) return it->second;
  return inner_->query_event(event);
}

// Waiting on a held event (empty_cache, the last step before an OOM) is the
// program waiting for the other stream: the free completes there.
void PlacementDevice::synchronize_event(DeviceEvent event) {
  if (const auto it = held_events_.find(event.handle); it != held_events_.end()) {
    it->second = true;
    return;
  }
  inner_->synchronize_event(event);
}

void PlacementDevice::destroy_event(DeviceEvent event) noexcept {
  held_events_.erase(event.handle);
  inner_->destroy_event(event);
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
