// libFuzzer target: diff A B. The input holds both recordings, A then B,
// parted by kSeparator; an input without it is compared with itself, and
// then no site and no peak may differ. The last byte picks what a site's
// growth measures and the listing's limit. The report is rendered in every
// format. A refusal must be a SnapshotError of one line.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "cachealloc/analyzer/compare.hpp"
#include "cachealloc/analyzer/event_source.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace cachealloc;

// What run_fuzzer.sh puts between two seeds to make a pair.
constexpr std::string_view kSeparator = "\n--cachealloc-fuzz-diff-B--\n";

std::optional<analyzer::RunSummary> summary_of(std::span<const std::byte> bytes) {
  const std::optional<snapshot::Snapshot> snapshot = fuzz::load_small(bytes);
  if (!snapshot) return std::nullopt;
  analyzer::SnapshotEvents source(*snapshot);
  try {
    return analyzer::summarize(source, analyzer::SummaryOptions{});
  } catch (const snapshot::SnapshotError& error) {
    fuzz::check_message(error.what());
    return std::nullopt;
  }
}

// The field `key` of the group `group`, 0 when absent.
std::uint64_t count_of(const analyzer::Document& document, std::string_view group, std::string_view key) {
  for (const analyzer::Section& section : document.sections) {
    const auto* fields = std::get_if<analyzer::FieldGroup>(&section);
    if (fields == nullptr || fields->key != group) continue;
    for (const analyzer::Field& field : fields->fields) {
      if (field.key != key) continue;
      if (const auto* value = std::get_if<std::uint64_t>(&field.value)) return *value;
    }
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> input = fuzz::as_bytes(data, size);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::size_t cut = text.find(kSeparator);
  const bool self = cut == std::string_view::npos;
  const std::optional<analyzer::RunSummary> a = summary_of(self ? input : input.first(cut));
  if (!a) return 0;
  const std::optional<analyzer::RunSummary> b = self ? a : summary_of(input.subspan(cut + kSeparator.size()));
  if (!b) return 0;
  const unsigned bits = fuzz::option_bits(data, size);
  analyzer::DiffOptions options;
  options.by = (bits & 3u) == 1 ? analyzer::DiffOptions::SiteMetric::allocated_over_run
               : (bits & 3u) == 2 ? analyzer::DiffOptions::SiteMetric::end
                                  : analyzer::DiffOptions::SiteMetric::peak;
  options.limit = (bits & 4u) ? 2 : 20;
  const analyzer::Document document = analyzer::diff_report(*a, *b, options);
  fuzz::render_all(document);
  if (self) {
    for (const char* change : {"grown", "shrunk", "new", "gone"}) {
      if (count_of(document, "site_changes", change) != 0) std::abort();
    }
  }
  return 0;
}
