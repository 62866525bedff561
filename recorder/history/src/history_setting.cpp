// CACHEALLOC_HISTORY's syntax (history.hpp): key:value pairs, as
// CACHEALLOC_CONF, into HistoryOptions for a streamed recording.
#include <optional>
#include <string>

#include "cachealloc/detail/setting_text.hpp"
#include "cachealloc/errors.hpp"
#include "cachealloc/history.hpp"

namespace cachealloc {

namespace {

[[noreturn]] void fail(std::string_view pair, std::string_view why) {
  std::string message = std::string(kHistoryEnvironment) + ": ";
  if (!pair.empty()) message += "'" + std::string(pair) + "': ";
  message += why;
  throw ConfigError(message);
}

using detail::trim_setting;

std::uint64_t parse_count(std::string_view pair, std::string_view value) {
  const std::optional<std::uint64_t> count = detail::parse_setting_count(value);
  if (!count) fail(pair, "expected a non-negative integer");
  return *count;
}

// The library's own parsers throw InvalidArgument with a message that lists
// the values; here it becomes the ConfigError of the pair.
template <typename Parse>
auto parse_with(std::string_view pair, Parse&& parse) {
  try {
    return parse();
  } catch (const InvalidArgument& e) {
    fail(pair, e.what());
  }
}

}  // namespace

HistoryOptions parse_history_setting(std::string_view text) {
  HistoryOptions options;
  bool has_stream = false;
  std::string_view rest = trim_setting(text);
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view pair = trim_setting(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (pair.empty()) continue;
    const std::size_t colon = pair.find(':');
    if (colon == std::string_view::npos) fail(pair, "expected key:value (e.g. stream:/tmp/run.bin)");
    const std::string_view key = trim_setting(pair.substr(0, colon));
    const std::string_view value = trim_setting(pair.substr(colon + 1));
    if (key == "stream") {
      if (value.empty()) fail(pair, "the stream needs a path");
      options.stream = std::string(value);
      has_stream = true;
    } else if (key == "stacks") {
      options.stacks = parse_with(pair, [&] { return parse_stack_capture(value); });
    } else if (key == "max_frames") {
      const std::uint64_t frames = parse_count(pair, value);
      if (frames == 0 || frames > 256) fail(pair, "must be within [1, 256]");
      options.max_frames = static_cast<std::uint32_t>(frames);
    } else if (key == "stacks_on_free") {
      if (value != "true" && value != "false") fail(pair, "expected true or false");
      options.stacks_on_free = value == "true";
    } else if (key == "clock") {
      options.clock = parse_with(pair, [&] { return parse_history_clock(value); });
    } else if (key == "when_full") {
      options.stream_when_full = parse_with(pair, [&] { return parse_stream_when_full(value); });
    } else if (key == "buffer_mb") {
      const std::uint64_t mb = parse_count(pair, value);
      if (mb < 16 || mb > (std::uint64_t{1} << 20)) fail(pair, "must be within [16, 1048576]");
      options.stream_buffer_bytes = static_cast<std::size_t>(mb) << 20;
    } else {
      fail(pair, "unknown key (known: stream, stacks, max_frames, stacks_on_free, clock, when_full, buffer_mb)");
    }
  }
  if (!has_stream) fail("", "no stream:PATH (e.g. CACHEALLOC_HISTORY=stream:/tmp/run.{pid}.bin)");
  return options;
}

std::filesystem::path expand_stream_path(std::string_view pattern, long pid, int device) {
  std::string out;
  out.reserve(pattern.size() + 16);
  while (!pattern.empty()) {
    if (pattern.starts_with("{pid}")) {
      out += std::to_string(pid);
      pattern.remove_prefix(5);
    } else if (pattern.starts_with("{device}")) {
      out += std::to_string(device);
      pattern.remove_prefix(8);
    } else {
      out += pattern.front();
      pattern.remove_prefix(1);
    }
  }
  return out;
}

}  // namespace cachealloc
