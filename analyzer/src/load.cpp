#include "cachealloc/analyzer/load.hpp"

#include <array>
#include <fstream>

#include "cachealloc/snapshot/format.hpp"

namespace cachealloc::analyzer {

namespace {
// Python pickles of protocol 2 and later start with the PROTO opcode.
constexpr std::byte kPickleProto{0x80};
}  // namespace

snapshot::Snapshot load(const std::filesystem::path& path) {
  std::array<std::byte, 16> head{};
  std::size_t got = 0;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw snapshot::SnapshotError(snapshot::ErrorCode::io, "cannot open " + path.string());
    in.read(reinterpret_cast<char*>(head.data()), static_cast<std::streamsize>(head.size()));
    got = static_cast<std::size_t>(in.gcount());
  }
  const std::span<const std::byte> bytes(head.data(), got);
  if (!snapshot::has_snapshot_magic(bytes) && got != 0 && head[0] == kPickleProto) {
    throw snapshot::SnapshotError(snapshot::ErrorCode::unsupported,
                                  path.string() + " looks like a PyTorch pickle; reading those is not supported yet");
  }
  return snapshot::read_snapshot(path);
}

}  // namespace cachealloc::analyzer
