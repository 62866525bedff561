#include <cstdlib>

#include "cachealloc/device.hpp"
#include "cachealloc/errors.hpp"

namespace cachealloc {

DeviceChoice parse_device_choice(const std::string& text) {
  if (text == "auto" || text.empty()) return DeviceChoice::automatic;
  if (text == "cuda") return DeviceChoice::cuda;
  if (text == "simulated") return DeviceChoice::simulated;
  throw InvalidArgument("CACHEALLOC_DEVICE: '" + text + "' is not one of auto, cuda, simulated");
}

std::shared_ptr<Device> make_device(DeviceChoice choice) {
  switch (choice) {
    case DeviceChoice::cuda: return make_cuda_device(cuda_current_device());
    case DeviceChoice::simulated: return make_simulated_device();
    case DeviceChoice::automatic: break;
  }
  return cuda_device_count() > 0 ? make_cuda_device(cuda_current_device()) : make_simulated_device();
}

std::shared_ptr<Device> make_device_from_environment() {
  const char* text = std::getenv("CACHEALLOC_DEVICE");
  return make_device(parse_device_choice(text ? text : "auto"));
}

}  // namespace cachealloc
