// The bytes of one input, as every cachealloc tool reads it: a path, or "-"
// for standard input; gzip or zstd compressed or not, recognized by content
// (the magic bytes 1f 8b and 28 b5 2f fd), never by the name, the way
// heaptrack_print reads its traces.
//
// The header is checked first. read_input() reads the first bytes (through
// the decompressor when there is one) and refuses anything that does not
// start like a snapshot (our magic, or the pickle PROTO opcode of protocol
// 2 to 5) before reading more, so /dev/zero, /dev/urandom, an endless pipe
// or a large file of something else is refused after at most one chunk
// (64 KiB of input, 256 KiB decompressed): bounded time and memory.
// Only an input that starts like a snapshot is read whole.
//
// A compressed input is held to a ratio while it inflates: past
// max_inflate_ratio() times the compressed bytes read so far (64 KiB at
// least), it is refused as a decompression bomb. Real snapshots inflate 3 to
// 25 times (PyTorch's pickles under zstd -19 or gzip -9); a bomb of 100 KB
// that would inflate to 3 GB stops after about 4 MiB, in milliseconds.
//
// Errors (SnapshotError):
//   io              the path cannot be opened or read; the message names the
//                   path and the OS reason
//   not_a_snapshot  "not a cachealloc snapshot or PyTorch memory snapshot
//                   (it starts with 00 00 00 00)", with "gzip-compressed" or
//                   "zstd-compressed" said when it was
//   truncated       the input is empty, or the compressed stream ends early
//   inconsistent    the compressed stream is damaged
//   unsupported     a compressed input inflates past the ratio above, or a
//                   stream passes its limit
// Thread safety: reentrant (standard input is read by one caller only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

namespace cachealloc::snapshot {

enum class Compression { none, gzip, zstd };

// The bound on inflation (above), for every input read after the call: 64
// by default; 0 lifts it (the stream limit, half this machine's memory,
// still holds). Set it before reading, from one thread.
inline constexpr std::uint64_t kDefaultMaxInflateRatio = 64;
void set_max_inflate_ratio(std::uint64_t ratio) noexcept;
std::uint64_t max_inflate_ratio() noexcept;

// "-" names standard input for every tool.
bool is_standard_input(const std::filesystem::path& path) noexcept;

// The compression the first bytes announce.
Compression detect_compression(std::span<const std::byte> prefix) noexcept;

// Whether the first bytes (at least 8 when the input has them) start like a
// snapshot this library reads: our magic (or a prefix of it, for a file cut
// short), or the PROTO opcode of pickle protocol 2 to 5.
bool starts_like_snapshot(std::span<const std::byte> prefix) noexcept;

// The whole input, decompressed, after the header check above. A large
// uncompressed regular file is mapped rather than copied.
class InputBytes {
 public:
  explicit InputBytes(const std::filesystem::path& path);
  ~InputBytes();
  InputBytes(const InputBytes&) = delete;
  InputBytes& operator=(const InputBytes&) = delete;
  std::span<const std::byte> bytes() const noexcept { return bytes_; }
  Compression compression() const noexcept { return compression_; }

 private:
  struct Mapped;
  std::unique_ptr<Mapped> mapped_;
  std::vector<std::byte> read_;
  std::span<const std::byte> bytes_;
  Compression compression_ = Compression::none;
};

}  // namespace cachealloc::snapshot
