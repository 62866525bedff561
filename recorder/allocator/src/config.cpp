#include "cachealloc/config.hpp"

#include <bit>
#include <optional>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "cachealloc/detail/setting_text.hpp"
#include "cachealloc/errors.hpp"

namespace cachealloc {
namespace {

constexpr std::size_t kMiB = 1u << 20;
constexpr std::size_t kLargeBuffer = 20 * kMiB;

[[noreturn]] void fail(std::string_view key, std::string_view value, std::string_view why) {
  std::string message = "CACHEALLOC_CONF: ";
  if (!key.empty()) {
    message += "'";
    message += key;
    if (!value.empty()) {
      message += ":";
      message += value;
    }
    message += "': ";
  }
  message += why;
  throw ConfigError(message);
}

using detail::trim_setting;

std::size_t parse_unsigned(std::string_view key, std::string_view value) {
  const std::optional<std::uint64_t> count = detail::parse_setting_count(value);
  if (!count) fail(key, value, "expected a non-negative integer");
  return static_cast<std::size_t>(*count);
}

double parse_double(std::string_view key, std::string_view value) {
  std::string copy(value);
  char* end = nullptr;
  const double result = std::strtod(copy.c_str(), &end);
  if (copy.empty() || end != copy.c_str() + copy.size() || !std::isfinite(result))
    fail(key, value, "expected a number");
  return result;
}

bool parse_bool(std::string_view key, std::string_view value) {
  if (value == "True" || value == "true" || value == "1") return true;
  if (value == "False" || value == "false" || value == "0") return false;
  fail(key, value, "expected True or False");
}

std::size_t floor_log2(std::size_t value) { return std::bit_width(value) - 1; }

// "4" (every interval) or "[256:1,512:2,>:8]" (per interval, keys in MiB).
void parse_roundup(std::string_view key, std::string_view value, AllocatorConfig& config) {
  auto& divisions = config.roundup_power2_divisions;
  if (value.empty()) fail(key, value, "expected a power of two or a [size_mb:divisions,...] list");
  if (value.front() != '[') {
    const std::size_t d = parse_unsigned(key, value);
    if (!std::has_single_bit(d)) fail(key, value, "divisions must be a power of two");
    divisions.fill(d);
    return;
  }
  if (value.back() != ']') fail(key, value, "a list must end with ']'");
  std::string_view body = value.substr(1, value.size() - 2);
  bool first = true;
  std::size_t last_index = 0;
  while (!body.empty()) {
    const auto comma = body.find(',');
    std::string_view entry = trim_setting(body.substr(0, comma));
    body = comma == std::string_view::npos ? std::string_view() : body.substr(comma + 1);
    const auto colon = entry.find(':');
    if (colon == std::string_view::npos) fail(key, value, "list entries are size_mb:divisions");
    const std::string_view size_text = trim_setting(entry.substr(0, colon));
    const std::size_t d = parse_unsigned(key, trim_setting(entry.substr(colon + 1)));
    if (d != 0 && !std::has_single_bit(d)) fail(key, value, "divisions must be a power of two");
    if (size_text == ">") {
      for (std::size_t i = first ? 0 : last_index + 1; i < divisions.size(); ++i) divisions[i] = d;
      first = false;
      last_index = divisions.size() - 1;
      continue;
    }
    const std::size_t size_mb = parse_unsigned(key, size_text);
    if (!std::has_single_bit(size_mb)) fail(key, value, "interval sizes must be powers of two (in MiB)");
    const std::size_t index = std::min(floor_log2(size_mb), divisions.size() - 1);
    if (first) {
      for (std::size_t i = 0; i < index; ++i) divisions[i] = d;
      first = false;
    }
    divisions[index] = d;
    last_index = index;
  }
}

}  // namespace

AllocatorConfig parse_config(std::string_view text) {
  AllocatorConfig config;
  config.source = std::string(trim_setting(text));
  std::string_view rest = trim_setting(text);
  while (!rest.empty()) {
    // Split on commas outside brackets.
    std::size_t end = 0;
    int depth = 0;
    for (; end < rest.size(); ++end) {
      if (rest[end] == '[') ++depth;
      if (rest[end] == ']') --depth;
      if (rest[end] == ',' && depth == 0) break;
    }
    const std::string_view pair = trim_setting(rest.substr(0, end));
    rest = end < rest.size() ? rest.substr(end + 1) : std::string_view();
    if (pair.empty()) continue;
    const auto colon = pair.find(':');
    if (colon == std::string_view::npos) fail(pair, "", "expected key:value");
    const std::string_view key = trim_setting(pair.substr(0, colon));
    const std::string_view value = trim_setting(pair.substr(colon + 1));

    if (key == "max_split_size_mb") {
      const std::size_t mb = parse_unsigned(key, value);
      if (mb <= kLargeBuffer / kMiB) fail(key, value, "must be greater than 20");
      config.max_split_size = mb >= std::numeric_limits<std::size_t>::max() / kMiB
                                  ? std::numeric_limits<std::size_t>::max()
                                  : mb * kMiB;
    } else if (key == "max_non_split_rounding_mb") {
      const std::size_t mb = parse_unsigned(key, value);
      if (mb == 0 || mb >= std::numeric_limits<std::size_t>::max() / kMiB) fail(key, value, "out of range");
      config.max_non_split_rounding = mb * kMiB;
    } else if (key == "garbage_collection_threshold") {
      const double threshold = parse_double(key, value);
      if (!(threshold > 0.0 && threshold < 1.0)) fail(key, value, "must be between 0.0 and 1.0 (exclusive)");
      config.garbage_collection_threshold = threshold;
    } else if (key == "roundup_power2_divisions") {
      parse_roundup(key, value, config);
    } else if (key == "expandable_segments") {
      config.expandable_segments = parse_bool(key, value);
    } else if (key == "release_lock_on_cudamalloc") {
      // Accepted for PyTorch compatibility. Our pools never hold a global
      // lock across a device reservation on the cached path, so it changes nothing.
      (void)parse_bool(key, value);
    } else if (key == "backend") {
      if (value != "native") fail(key, value, "only the native backend is supported");
    } else {
      fail(key, value, "unknown option (known: max_split_size_mb, max_non_split_rounding_mb, "
                       "roundup_power2_divisions, garbage_collection_threshold, expandable_segments, "
                       "release_lock_on_cudamalloc, backend)");
    }
  }
  return config;
}

AllocatorConfig config_from_environment() {
  const char* text = std::getenv("CACHEALLOC_CONF");
  return text ? parse_config(text) : AllocatorConfig{};
}

std::size_t roundup_divisions_for(const AllocatorConfig& config, std::size_t size) noexcept {
  // Intervals start at 1 MiB (2^20): sizes below use the first one, sizes
  // at or above 32 GiB the last, as PyTorch does.
  const int log_size = size == 0 ? 0 : static_cast<int>(floor_log2(size));
  int index = log_size - 20;
  index = std::max(index, 0);
  index = std::min(index, static_cast<int>(kRoundupIntervals) - 1);
  return config.roundup_power2_divisions[static_cast<std::size_t>(index)];
}

std::string to_string(const AllocatorConfig& config) {
  std::ostringstream out;
  const char* sep = "";
  if (config.max_split_size != std::numeric_limits<std::size_t>::max()) {
    out << sep << "max_split_size_mb:" << config.max_split_size / kMiB;
    sep = ",";
  }
  if (config.max_non_split_rounding != kLargeBuffer) {
    out << sep << "max_non_split_rounding_mb:" << config.max_non_split_rounding / kMiB;
    sep = ",";
  }
  bool any_roundup = false;
  for (auto d : config.roundup_power2_divisions) any_roundup |= d != 0;
  if (any_roundup) {
    out << sep << "roundup_power2_divisions:[";
    for (std::size_t i = 0; i < kRoundupIntervals; ++i)
      out << (i ? "," : "") << (std::size_t{1} << i) << ":" << config.roundup_power2_divisions[i];
    out << "]";
    sep = ",";
  }
  if (config.garbage_collection_threshold > 0) {
    out << sep << "garbage_collection_threshold:" << config.garbage_collection_threshold;
    sep = ",";
  }
  if (config.expandable_segments) out << sep << "expandable_segments:True";
  return out.str();
}

}  // namespace cachealloc
