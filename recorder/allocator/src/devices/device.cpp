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

namespace {

// "512MiB", "3GiB", "1048576": bytes with an optional binary unit.
std::uint64_t parse_size(const std::string& key, const std::string& text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const std::string unit = text.substr(digits);
  std::uint64_t shift = 0;
  if (unit == "" || unit == "B") shift = 0;
  else if (unit == "KiB") shift = 10;
  else if (unit == "MiB") shift = 20;
  else if (unit == "GiB") shift = 30;
  else if (unit == "TiB") shift = 40;
  else digits = 0;
  if (digits == 0 || digits > 15)
    throw InvalidArgument("CACHEALLOC_SIMULATED: " + key + "='" + text +
                          "' is not a size (bytes, or a whole number of KiB, MiB, GiB or TiB)");
  const std::uint64_t value = std::stoull(text.substr(0, digits));
  if (shift && value > (~0ull >> shift)) throw InvalidArgument("CACHEALLOC_SIMULATED: " + key + "='" + text + "' is too large");
  return value << shift;
}

}  // namespace

SimulatedDeviceOptions simulated_h200_options() {
  SimulatedDeviceOptions options;
  options.capacity = 150109880320ull;        // cudaMemGetInfo total
  options.context_overhead = 518ull << 20;   // nvidia-smi's used_memory - memory_reserved()
  options.driver_reserved = 644939776ull;    // NVML memory.reserved; + capacity = memory.total
  return options;
}

SimulatedDeviceOptions simulated_options_from_text(const std::string& text) {
  SimulatedDeviceOptions options = simulated_h200_options();
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    const std::size_t equals = item.find('=');
    if (equals == std::string::npos)
      throw InvalidArgument("CACHEALLOC_SIMULATED: '" + item + "' is not key=value");
    const std::string key = item.substr(0, equals);
    const std::string value = item.substr(equals + 1);
    if (key == "capacity") options.capacity = parse_size(key, value);
    else if (key == "context") options.context_overhead = parse_size(key, value);
    else if (key == "other_processes_bytes") options.other_processes_bytes = parse_size(key, value);
    else if (key == "driver_reserved") options.driver_reserved = parse_size(key, value);
    else if (key == "other_processes") {
      const std::uint64_t count = parse_size(key, value);
      if (count > 1'000'000 || value.find_first_not_of("0123456789") != std::string::npos)
        throw InvalidArgument("CACHEALLOC_SIMULATED: other_processes='" + value + "' is not a count of processes");
      options.other_processes = static_cast<std::uint32_t>(count);
    } else {
      throw InvalidArgument("CACHEALLOC_SIMULATED: unknown key '" + key +
                            "' (keys: capacity, context, driver_reserved, other_processes, other_processes_bytes)");
    }
  }
  if (options.capacity == 0) throw InvalidArgument("CACHEALLOC_SIMULATED: capacity must be more than 0");
  if (options.driver_reserved > (~std::size_t{0}) - options.capacity)
    throw InvalidArgument("CACHEALLOC_SIMULATED: driver_reserved is too large");
  if (options.context_overhead > options.capacity ||
      options.other_processes_bytes > options.capacity - options.context_overhead)
    throw InvalidArgument("CACHEALLOC_SIMULATED: context and other_processes_bytes exceed the capacity");
  return options;
}

namespace {

std::shared_ptr<Device> simulated_from_environment() {
  const char* text = std::getenv("CACHEALLOC_SIMULATED");
  return make_simulated_device(simulated_options_from_text(text ? text : ""));
}

}  // namespace

std::shared_ptr<Device> make_device(DeviceChoice choice) {
  switch (choice) {
    case DeviceChoice::cuda: return make_cuda_device(cuda_current_device());
    case DeviceChoice::simulated: return simulated_from_environment();
    case DeviceChoice::automatic: break;
  }
  return cuda_device_count() > 0 ? make_cuda_device(cuda_current_device()) : simulated_from_environment();
}

std::shared_ptr<Device> make_device_from_environment() {
  const char* text = std::getenv("CACHEALLOC_DEVICE");
  return make_device(parse_device_choice(text ? text : "auto"));
}

}  // namespace cachealloc
