// The settings a replay runs under: those the recording ran under, --set
// pairs over them, and a cap in bytes as the allocator's memory fraction.
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "cachealloc/errors.hpp"
#include "whatif/replay_parts.hpp"

namespace cachealloc::analyzer {

namespace whatif {

std::string recorded_setting(const snapshot::Snapshot& head, const std::string& key) {
  const auto it = head.settings.find(key);
  return it == head.settings.end() ? std::string() : it->second;
}

double fraction_for_cap(std::uint64_t cap, std::uint64_t total) {
  const double t = static_cast<double>(total);
  double fraction = static_cast<double>(cap) / t;
  for (int i = 0; i < 64 && static_cast<std::uint64_t>(fraction * t) < cap; ++i)
    fraction = std::nextafter(fraction, 2.0);
  for (int i = 0; i < 64 && static_cast<std::uint64_t>(fraction * t) > cap; ++i)
    fraction = std::nextafter(fraction, 0.0);
  return fraction;
}

namespace {

// PyTorch's allocator_settings, one value each (its PYTORCH_CUDA_ALLOC_CONF
// text may hold keys that are not the allocator's).
AllocatorConfig pytorch_settings(const snapshot::Snapshot& head, bool& known) {
  AllocatorConfig config;
  if (head.settings.find("expandable_segments") == head.settings.end()) {
    known = false;
    for (const auto& segment : head.segments) config.expandable_segments |= segment.expandable;
    return config;
  }
  config.expandable_segments = recorded_setting(head, "expandable_segments") == "True";
  const std::string split = recorded_setting(head, "max_split_size");
  long long value = -1;
  std::from_chars(split.data(), split.data() + split.size(), value);
  if (value > 0) config.max_split_size = static_cast<std::size_t>(value);
  const std::string gc = recorded_setting(head, "garbage_collection_threshold");
  if (!gc.empty()) config.garbage_collection_threshold = std::strtod(gc.c_str(), nullptr);
  for (std::size_t i = 0; i < kRoundupIntervals; ++i) {
    const std::string d = recorded_setting(head, "roundup_power2_divisions." + std::to_string(std::size_t{1} << i));
    std::size_t divisions = 0;
    std::from_chars(d.data(), d.data() + d.size(), divisions);
    config.roundup_power2_divisions[i] = divisions;
  }
  if (const std::string all = recorded_setting(head, "roundup_power2_divisions"); !all.empty()) {
    std::size_t divisions = 0;  // older PyTorch: one value for every size
    const auto [stop, error] = std::from_chars(all.data(), all.data() + all.size(), divisions);
    if (error == std::errc{} && stop == all.data() + all.size()) config.roundup_power2_divisions.fill(divisions);
  }
  return config;
}

}  // namespace

}  // namespace whatif

AllocatorConfig recorded_settings(const snapshot::Snapshot& head, bool& known) {
  known = true;
  if (head.header.source == "pytorch-pickle") return whatif::pytorch_settings(head, known);
  // Ours keep the CACHEALLOC_CONF text.
  const auto it = head.settings.find("config");
  if (it == head.settings.end()) {
    known = false;
    return {};
  }
  return parse_config(it->second);
}

std::string settings_with(std::string base, const std::vector<std::string>& set) {
  for (const std::string& given : set) {
    std::string pair = given;
    const auto equals = pair.find('=');
    if (equals != std::string::npos) pair[equals] = ':';
    if (pair.find(':') == std::string::npos || pair.front() == ':')
      throw ConfigError("--set " + given + ": expected KEY=VALUE, a CACHEALLOC_CONF key and its value");
    try {
      (void)parse_config(pair);
    } catch (const ConfigError& error) {
      // The parser's own words, without its "CACHEALLOC_CONF: 'key:value': " lead.
      std::string why = error.what();
      if (why.starts_with("CACHEALLOC_CONF: ")) why.erase(0, 17);
      if (why.starts_with("'"))
        if (const auto end = why.find("': "); end != std::string::npos) why.erase(0, end + 3);
      throw ConfigError("--set " + given + ": " + why);
    }
    base += (base.empty() ? "" : ",") + pair;
  }
  return base;
}

}  // namespace cachealloc::analyzer
