// libFuzzer target: our format's reader (decode(), the validation both
// readers share) on arbitrary bytes. Any outcome but a decoded snapshot or a
// SnapshotError with a one-line message is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "cachealloc/snapshot/format.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const cachealloc::snapshot::Snapshot snapshot = cachealloc::snapshot::decode(bytes);
    // What it decoded is valid: writing it and reading it back gives it again.
    if (cachealloc::snapshot::decode(cachealloc::snapshot::encode(snapshot)).segments != snapshot.segments) std::abort();
  } catch (const cachealloc::snapshot::SnapshotError& error) {
    cachealloc::fuzz::check_message(error.what());
  }
  return 0;
}
