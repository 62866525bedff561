// The text of key:value settings strings (CACHEALLOC_CONF,
// PYTORCH_CUDA_ALLOC_CONF, CACHEALLOC_HISTORY): one trim and one integer
// parse for every parser of them, so they accept the same spacing and
// refuse the same numbers.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>
#include <system_error>

namespace cachealloc::detail {

// Without the spaces and tabs around it (and a trailing newline, as a
// shell's $(cat file) or an editor leaves one).
inline std::string_view trim_setting(std::string_view text) noexcept {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\n')) text.remove_suffix(1);
  return text;
}

// A non-negative decimal integer, the whole text; nothing for an empty text,
// a sign, other characters or a figure past 2^64-1.
inline std::optional<std::uint64_t> parse_setting_count(std::string_view text) noexcept {
  std::uint64_t result = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, result);
  if (text.empty() || error != std::errc{} || stop != end) return std::nullopt;
  return result;
}

}  // namespace cachealloc::detail
