#include "cachealloc/snapshot/load.hpp"

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "pickle/pickle_file.hpp"

#include <string_view>

namespace cachealloc::snapshot {

namespace {
constexpr const char* kUnrecognized = "not a cachealloc snapshot or PyTorch memory snapshot";

// A file shorter than our magic but equal to its start is a truncated
// snapshot of ours, and decode() says so; the magic is documented in FORMAT.md.
bool starts_like_our_magic(std::span<const std::byte> bytes) {
  constexpr std::string_view kMagic("\x89" "CASNAP\n", 8);
  if (bytes.empty() || bytes.size() >= kMagic.size()) return false;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (std::to_integer<char>(bytes[i]) != kMagic[i]) return false;
  }
  return true;
}
}  // namespace

Snapshot load(std::span<const std::byte> bytes) {
  if (has_pickle_header(bytes)) return decode_pytorch_pickle(bytes);
  if (has_snapshot_magic(bytes) || starts_like_our_magic(bytes)) return decode(bytes);
  if (bytes.empty()) throw SnapshotError(ErrorCode::truncated, "truncated snapshot: the input is empty");
  throw SnapshotError(ErrorCode::not_a_snapshot, kUnrecognized);
}

Snapshot load(const std::filesystem::path& path) {
  const pickle_file::FileBytes file(path, "snapshot");
  return load(file.bytes());
}

}  // namespace cachealloc::snapshot
