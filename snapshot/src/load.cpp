#include "cachealloc/snapshot/load.hpp"

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/input.hpp"
#include "cachealloc/snapshot/pickle.hpp"

namespace cachealloc::snapshot {

Snapshot load(std::span<const std::byte> bytes) {
  if (has_pickle_header(bytes)) return decode_pytorch_pickle(bytes);
  if (starts_like_snapshot(bytes)) return decode(bytes);
  if (bytes.empty()) throw SnapshotError(ErrorCode::truncated, "truncated snapshot: the input is empty");
  throw SnapshotError(ErrorCode::not_a_snapshot, "not a cachealloc snapshot or PyTorch memory snapshot");
}

Snapshot load(const std::filesystem::path& path) {
  // The header is checked before the rest is read (input.hpp).
  const InputBytes input(path);
  return load(input.bytes());
}

}  // namespace cachealloc::snapshot
