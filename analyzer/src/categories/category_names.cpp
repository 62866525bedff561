#include <algorithm>
#include <array>
#include <string>

#include "cachealloc/analyzer/categories.hpp"

namespace cachealloc::analyzer {

namespace {

constexpr std::array<const char*, kCategoryCount> kLabels = {
    "parameter", "gradient", "optimizer state", "activation", "temporary", "workspace", "CUDA graph pool", "other"};

}  // namespace

const char* category_key(Category category) noexcept {
  const auto index = static_cast<std::size_t>(category);
  return index < kCategoryCount ? events::to_string(category) : "other";
}

const char* category_label(Category category) noexcept {
  const auto index = static_cast<std::size_t>(category);
  return index < kLabels.size() ? kLabels[index] : "other";
}

std::optional<Category> parse_category(std::string_view name) noexcept {
  std::string key(name);
  std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) {
    return c == '-' || c == ' ' ? '_' : static_cast<char>(std::tolower(c));
  });
  Category category{};
  if (events::parse_allocation_category(key, category)) return category;
  return std::nullopt;
}

const char* to_string(CategorySource source) noexcept {
  return source == CategorySource::exact ? "exact" : "inferred";
}

}  // namespace cachealloc::analyzer
