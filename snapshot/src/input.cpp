#include "cachealloc/snapshot/input.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/stream.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "format/format_v3.hpp"
#include "pickle/pickle_file.hpp"

namespace cachealloc::snapshot {

struct InputBytes::Mapped {
  explicit Mapped(const std::filesystem::path& path) : file(path, "snapshot") {}
  pickle_file::FileBytes file;
};

namespace {

constexpr std::size_t kChunk = std::size_t{1} << 16;
// Enough of the start to recognize every format we read.
constexpr std::size_t kPrefix = 16;

[[noreturn]] void io_error(const std::string& action, const std::filesystem::path& path, int error) {
  throw SnapshotError(ErrorCode::io, "cannot " + action + " " + path.string() + ": " + std::strerror(error));
}

std::string hex_start(std::span<const std::byte> bytes) {
  std::string text;
  for (std::size_t i = 0; i < bytes.size() && i < 4; ++i) {
    char buffer[4];
    std::snprintf(buffer, sizeof buffer, "%s%02x", i == 0 ? "" : " ", std::to_integer<unsigned>(bytes[i]));
    text += buffer;
  }
  return text;
}

const char* compression_name(Compression compression) {
  switch (compression) {
    case Compression::gzip: return "gzip-compressed ";
    case Compression::zstd: return "zstd-compressed ";
    case Compression::none: break;
  }
  return "";
}

// A compressor we do not read, told by its magic (xz's, bzip2's and lz4's
// format specifications): its name and the command that undoes it, so the
// user's next step is one command rather than a search. Null when none.
struct ForeignCompressor {
  const char* name;
  const char* undo;  // decompresses FILE beside itself
};
const ForeignCompressor* foreign_compressor(std::span<const std::byte> start) {
  static constexpr struct {
    std::string_view magic;
    ForeignCompressor compressor;
  } kKnown[] = {
      {std::string_view("\xfd" "7zXZ\0", 6), {"xz", "xz -d FILE"}},
      {std::string_view("BZh", 3), {"bzip2", "bzip2 -d FILE"}},
      {std::string_view("\x04\x22\x4d\x18", 4), {"lz4", "lz4 -d FILE"}},
      {std::string_view("\x02\x21\x4c\x18", 4), {"lz4 (legacy frame)", "lz4 -d FILE"}},
      {std::string_view("PK\x03\x04", 4), {"zip", "unzip FILE"}},
      {std::string_view("7z\xbc\xaf\x27\x1c", 6), {"7z", "7z x FILE"}},
  };
  for (const auto& known : kKnown) {
    if (start.size() < known.magic.size()) continue;
    if (std::memcmp(start.data(), known.magic.data(), known.magic.size()) == 0) return &known.compressor;
  }
  return nullptr;
}

// Refuses what cannot be a snapshot, on its first bytes alone.
void check_start(std::span<const std::byte> start, Compression compression) {
  if (start.empty()) {
    throw SnapshotError(ErrorCode::truncated, std::string("truncated snapshot: the ") + compression_name(compression) +
                                                  "input is empty");
  }
  if (starts_like_snapshot(start)) return;
  if (const ForeignCompressor* foreign = foreign_compressor(start)) {
    throw SnapshotError(ErrorCode::unsupported,
                        std::string(foreign->name) + "-compressed, which is not read here (gzip and zstd are): "
                                                     "decompress it first (" + foreign->undo + "), then read the result");
  }
  std::string what = compression == Compression::none ? "it starts with " : "its content starts with ";
  what += hex_start(start);
  if (compression != Compression::none) what += std::string("; ") + (compression == Compression::gzip ? "gzip" : "zstd") + "-compressed";
  throw SnapshotError(ErrorCode::not_a_snapshot, "not a cachealloc snapshot or PyTorch memory snapshot (" + what + ")");
}

// The most a stream (a pipe, standard input, a device, any decompressed
// input) may hold: half this machine's memory, or CACHEALLOC_MAX_STREAM_BYTES.
// A regular file is mapped instead and has no such bound.
std::uint64_t stream_limit() {
  if (const char* text = std::getenv("CACHEALLOC_MAX_STREAM_BYTES"); text != nullptr && *text != 0) {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 10);
    if (end != nullptr && *end == 0 && value > 0) return value;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return std::uint64_t{1} << 34;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 2;
}

// Stops an endless or oversized stream as soon as it can be told: our format
// announces its size in the first 24 bytes, so a stream that goes past it (or
// announces more than the limit) is refused at once; anything else when it
// passes stream_limit(). Memory then stays below the limit, time below one
// pass over it.
class StreamGuard {
 public:
  explicit StreamGuard(Compression compression)
      : compression_(compression), limit_(std::max<std::uint64_t>(stream_limit(), 4096)) {}
  // `so_far`: every byte of the (decompressed) input read until now.
  void grew(std::span<const std::byte> so_far) {
    if (!expected_ && so_far.size() >= detail::kFramingSize && has_snapshot_magic(so_far)) {
      const std::uint64_t body = detail::read_u64(so_far, 16);
      if (detail::read_u32(so_far, 8) == kStreamFormatVersion) {
        // A streamed recording's size is unknown to its header: only the limit holds.
        detail::check_framing(so_far.first(detail::kFramingSize), UINT64_MAX);
        expected_ = UINT64_MAX;
      } else if (body <= limit_ - detail::kFramingSize) {
        // The framing's own checks (a newer version, the reserved field).
        detail::check_framing(so_far.first(detail::kFramingSize), detail::kFramingSize + body);
        expected_ = detail::kFramingSize + body;
      } else {
        // A newer version is named before the size it may have changed.
        if (detail::read_u32(so_far, 8) > kFormatVersion) detail::check_framing(so_far.first(detail::kFramingSize), UINT64_MAX);
        throw SnapshotError(ErrorCode::unsupported, "the header announces a body of " + std::to_string(body) +
                                                        " bytes, more than the " + std::to_string(limit_) +
                                                        " bytes a " + what() + " may hold; read it from a file");
      }
    }
    if (expected_ && so_far.size() > *expected_) {
      throw SnapshotError(ErrorCode::inconsistent, "inconsistent snapshot: more bytes follow the " +
                                                       std::to_string(*expected_ - detail::kFramingSize) +
                                                       "-byte body the header announces");
    }
    if (so_far.size() > limit_) {
      throw SnapshotError(ErrorCode::unsupported, "the " + what() + " goes on past " + std::to_string(limit_) +
                                                      " bytes (half this machine's memory, or "
                                                      "CACHEALLOC_MAX_STREAM_BYTES) without ending; read it from a file");
    }
  }

 private:
  std::string what() const {
    return compression_ == Compression::none ? "stream" : std::string(compression_name(compression_)) + "stream";
  }
  Compression compression_;
  std::uint64_t limit_;
  std::optional<std::uint64_t> expected_;
};

std::atomic<std::uint64_t> max_inflate{kDefaultMaxInflateRatio};

// Refuses a compressed input that inflates past max_inflate_ratio() times
// what has been read of it. The ratio is of the bytes read so far, not of the
// file's size, so a bomb stops after its first chunk whatever its length;
// the floor of 64 KiB lets the first chunk of a small file inflate whole.
class InflateGuard {
 public:
  explicit InflateGuard(Compression compression) : compression_(compression), ratio_(max_inflate_ratio()) {}
  void grew(std::uint64_t compressed_read, std::uint64_t inflated) const {
    if (ratio_ == 0) return;
    const std::uint64_t read = std::max<std::uint64_t>(compressed_read, kChunk);
    if (inflated / ratio_ <= read) return;
    throw SnapshotError(ErrorCode::unsupported,
                        std::string("the ") + compression_name(compression_) + "input inflates past " +
                            std::to_string(ratio_) + " times its size (" + std::to_string(inflated) +
                            " bytes from the first " + std::to_string(compressed_read) +
                            "): refused as a decompression bomb; --max-inflate RATIO allows more");
  }

 private:
  Compression compression_;
  std::uint64_t ratio_;
};

// Standard input or the file; closes what it opened.
class Source {
 public:
  explicit Source(const std::filesystem::path& path) : path_(path) {
    if (is_standard_input(path)) {
      fd_ = STDIN_FILENO;
      return;
    }
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) io_error("open snapshot", path, errno);
    owned_ = true;
    struct stat info {};
    if (::fstat(fd_, &info) != 0) io_error("read snapshot", path, errno);
    if (S_ISDIR(info.st_mode)) io_error("read snapshot", path, EISDIR);
    regular_ = S_ISREG(info.st_mode);
  }
  ~Source() {
    if (owned_) ::close(fd_);
  }
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;
  bool regular() const noexcept { return regular_; }
  // Up to `size` bytes; 0 at the end.
  std::size_t read(std::byte* data, std::size_t size) {
    for (;;) {
      const ssize_t got = ::read(fd_, data, size);
      if (got >= 0) return static_cast<std::size_t>(got);
      if (errno != EINTR) io_error("read snapshot", path_, errno);
    }
  }
  // Fills `data` unless the input ends first.
  std::size_t read_full(std::byte* data, std::size_t size) {
    std::size_t filled = 0;
    while (filled < size) {
      const std::size_t got = read(data + filled, size - filled);
      if (got == 0) break;
      filled += got;
    }
    return filled;
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool owned_ = false;
  bool regular_ = false;
};

// Decompresses `prefix` and the rest of `source` into `out`, checking the
// start of the output as soon as it has kPrefix bytes.
void inflate_gzip(Source& source, std::span<const std::byte> prefix, std::vector<std::byte>& out) {
  z_stream stream{};
  if (inflateInit2(&stream, 15 + 16) != Z_OK) throw SnapshotError(ErrorCode::inconsistent, "zlib: cannot start");
  struct End {
    z_stream& s;
    ~End() { inflateEnd(&s); }
  } end{stream};
  std::vector<std::byte> input(kChunk);
  std::copy(prefix.begin(), prefix.end(), input.begin());
  stream.next_in = reinterpret_cast<Bytef*>(input.data());
  stream.avail_in = static_cast<uInt>(prefix.size());
  bool checked = false, in_member = true;
  StreamGuard guard(Compression::gzip);
  const InflateGuard inflation(Compression::gzip);
  std::uint64_t compressed_read = 0;  // total_in restarts with each member
  for (;;) {
    if (stream.avail_in == 0) {
      const std::size_t got = source.read(input.data(), input.size());
      if (got == 0) break;
      stream.next_in = reinterpret_cast<Bytef*>(input.data());
      stream.avail_in = static_cast<uInt>(got);
    }
    if (!in_member) {
      // Another member follows (cat a.gz b.gz), as gzip -d reads it.
      compressed_read += stream.total_in;
      if (inflateReset(&stream) != Z_OK) throw SnapshotError(ErrorCode::inconsistent, "zlib: cannot restart");
      in_member = true;
    }
    const std::size_t before = out.size();
    out.resize(before + 4 * kChunk);
    stream.next_out = reinterpret_cast<Bytef*>(out.data() + before);
    stream.avail_out = static_cast<uInt>(4 * kChunk);
    const int status = inflate(&stream, Z_NO_FLUSH);
    out.resize(out.size() - stream.avail_out);
    if (status == Z_STREAM_END) {
      in_member = false;
    } else if (status != Z_OK && status != Z_BUF_ERROR) {
      throw SnapshotError(ErrorCode::inconsistent,
                          std::string("damaged gzip data: ") + (stream.msg != nullptr ? stream.msg : "inflate failed"));
    }
    if (!checked && out.size() >= kPrefix) {
      check_start(std::span<const std::byte>(out).first(kPrefix), Compression::gzip);
      checked = true;
    }
    inflation.grew(compressed_read + stream.total_in, out.size());
    guard.grew(out);
  }
  if (in_member) throw SnapshotError(ErrorCode::truncated, "truncated snapshot: the gzip data ends early");
  if (!checked) check_start(out, Compression::gzip);
}

void decompress_zstd(Source& source, std::span<const std::byte> prefix, std::vector<std::byte>& out) {
  ZSTD_DStream* stream = ZSTD_createDStream();
  if (stream == nullptr) throw SnapshotError(ErrorCode::inconsistent, "zstd: cannot start");
  struct End {
    ZSTD_DStream* s;
    ~End() { ZSTD_freeDStream(s); }
  } end{stream};
  ZSTD_DCtx_setParameter(stream, ZSTD_d_windowLogMax, 27);  // 128 MiB windows at most: bounded memory
  std::vector<std::byte> input(kChunk);
  std::copy(prefix.begin(), prefix.end(), input.begin());
  std::size_t have = prefix.size();
  bool checked = false;
  StreamGuard guard(Compression::zstd);
  const InflateGuard inflation(Compression::zstd);
  std::uint64_t compressed_read = 0;  // before the chunk in `input`
  std::size_t last = 1;  // ZSTD_decompressStream's hint: 0 once a frame is complete
  for (;;) {
    if (have == 0) {
      have = source.read(input.data(), input.size());
      if (have == 0) break;
    }
    ZSTD_inBuffer in{input.data(), have, 0};
    while (in.pos < in.size) {
      const std::size_t before = out.size();
      out.resize(before + 4 * kChunk);
      ZSTD_outBuffer buffer{out.data() + before, 4 * kChunk, 0};
      last = ZSTD_decompressStream(stream, &buffer, &in);
      out.resize(before + buffer.pos);
      if (ZSTD_isError(last))
        throw SnapshotError(ErrorCode::inconsistent, std::string("damaged zstd data: ") + ZSTD_getErrorName(last));
      if (!checked && out.size() >= kPrefix) {
        check_start(std::span<const std::byte>(out).first(kPrefix), Compression::zstd);
        checked = true;
      }
      inflation.grew(compressed_read + in.pos, out.size());
      guard.grew(out);
    }
    compressed_read += have;
    have = 0;
  }
  // Flush what the decoder still holds.
  for (;;) {
    const std::size_t before = out.size();
    out.resize(before + 4 * kChunk);
    ZSTD_inBuffer in{nullptr, 0, 0};
    ZSTD_outBuffer buffer{out.data() + before, 4 * kChunk, 0};
    const std::size_t status = ZSTD_decompressStream(stream, &buffer, &in);
    out.resize(before + buffer.pos);
    inflation.grew(compressed_read, out.size());
    guard.grew(out);
    if (ZSTD_isError(status)) break;
    if (buffer.pos == 0) break;
    last = status;
  }
  if (last != 0) throw SnapshotError(ErrorCode::truncated, "truncated snapshot: the zstd data ends early");
  if (!checked) check_start(out, Compression::zstd);
}

}  // namespace

void set_max_inflate_ratio(std::uint64_t ratio) noexcept { max_inflate.store(ratio, std::memory_order_relaxed); }
std::uint64_t max_inflate_ratio() noexcept { return max_inflate.load(std::memory_order_relaxed); }

bool is_standard_input(const std::filesystem::path& path) noexcept { return path.native() == "-"; }

Compression detect_compression(std::span<const std::byte> prefix) noexcept {
  auto at = [&](std::size_t i) { return std::to_integer<unsigned>(prefix[i]); };
  if (prefix.size() >= 2 && at(0) == 0x1f && at(1) == 0x8b) return Compression::gzip;
  if (prefix.size() >= 4 && at(0) == 0x28 && at(1) == 0xb5 && at(2) == 0x2f && at(3) == 0xfd) return Compression::zstd;
  return Compression::none;
}

bool starts_like_snapshot(std::span<const std::byte> prefix) noexcept {
  if (has_pickle_header(prefix) || has_snapshot_magic(prefix)) return true;
  // A file shorter than our magic but equal to its start is a truncated
  // snapshot of ours (decode() says so); the magic is in FORMAT.md.
  constexpr std::string_view kMagic("\x89" "CASNAP\n", 8);
  if (prefix.empty() || prefix.size() >= kMagic.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::to_integer<char>(prefix[i]) != kMagic[i]) return false;
  }
  return true;
}

InputBytes::~InputBytes() = default;

InputBytes::InputBytes(const std::filesystem::path& path) {
  bool regular = false;
  {
    Source source(path);
    regular = source.regular();
    std::byte prefix[kPrefix];
    const std::size_t got = source.read_full(prefix, kPrefix);
    const std::span<const std::byte> start(prefix, got);
    compression_ = detect_compression(start);
    if (compression_ == Compression::gzip) {
      inflate_gzip(source, start, read_);
    } else if (compression_ == Compression::zstd) {
      decompress_zstd(source, start, read_);
    } else {
      check_start(start, Compression::none);
      if (!regular) {
        read_.assign(start.begin(), start.end());
        std::size_t filled = read_.size();
        StreamGuard guard(Compression::none);
        for (;;) {
          guard.grew(std::span<const std::byte>(read_).first(filled));
          read_.resize(filled + kChunk);
          const std::size_t n = source.read(read_.data() + filled, kChunk);
          filled += n;
          if (n == 0) break;
        }
        read_.resize(filled);
      }
    }
    if (compression_ != Compression::none || !regular) {
      bytes_ = read_;
      return;
    }
  }
  // A regular file that starts like a snapshot: mapped when large.
  mapped_ = std::make_unique<Mapped>(path);
  bytes_ = mapped_->file.bytes();
}

}  // namespace cachealloc::snapshot
