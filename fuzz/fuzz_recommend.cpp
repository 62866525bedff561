// libFuzzer target: recommend (the verdict drawn from a sweep) and the oom
// report's recommendation section, on whatever load() accepts. recommend
// runs a grid of 2 points (4 under a cap) on the calling thread, at the
// recorded cap, or at a capacity the input's last byte picks. Each report is
// rendered in every format; the verdict is one line. A refusal must be a
// SnapshotError or a cachealloc::Error of one line; the oom report never
// throws for a trace the replay cannot handle (sweep.hpp).
#include <cstddef>
#include <cstdint>

#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/analyzer/sweep.hpp"
#include "cachealloc/errors.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace cachealloc;

void recommend(const snapshot::Snapshot& snapshot, unsigned bits) {
  analyzer::SnapshotEvents source(snapshot);
  analyzer::RecommendOptions options;
  options.sweep.threads = 1;
  if (bits & 1u) options.sweep.capacity = std::uint64_t{48} << 20;
  if (bits & 2u) options.sweep.set.push_back("max_split_size_mb=20");
  options.sweep.axes = {analyzer::sweep_axis("expandable_segments=False,True"),
                        analyzer::sweep_axis("max_split_size_mb=unlimited"),
                        analyzer::sweep_axis("roundup_power2_divisions=0")};
  try {
    const analyzer::Document document = analyzer::recommend_report(source, options);
    for (const analyzer::Section& section : document.sections) {
      if (const auto* text = std::get_if<analyzer::Text>(&section)) {
        for (const std::string& line : text->lines) fuzz::check_utf8(line);
      }
    }
    fuzz::render_all(document);
  } catch (const snapshot::SnapshotError& error) {
    fuzz::check_message(error.what());
  } catch (const Error& error) {
    fuzz::check_message(error.what());
  }
}

void oom_with_recommendation(const snapshot::Snapshot& snapshot) {
  analyzer::SnapshotEvents source(snapshot);
  try {
    fuzz::render_all(analyzer::oom_report_with_recommendation(source, analyzer::ReportOptions{}, 1));
  } catch (const snapshot::SnapshotError& error) {
    // The oom report itself refuses what every report refuses (an
    // impossible state); its recommendation section never throws.
    fuzz::check_message(error.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::optional<snapshot::Snapshot> snapshot = fuzz::load_small(fuzz::as_bytes(data, size));
  if (!snapshot) return 0;
  recommend(*snapshot, fuzz::option_bits(data, size));
  oom_with_recommendation(*snapshot);
  return 0;
}
