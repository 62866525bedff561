// StreamFileWriter: a streamed recording's chunks, appended one write(2)
// each (stream.hpp, docs/FORMAT.md "Version 7").
#include <fcntl.h>
#include <unistd.h>

#include <zstd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/stream.hpp"

#include "archive.hpp"
#include "format_v3.hpp"
#include "serialize.hpp"
#include "stream_format.hpp"

namespace cachealloc::snapshot {
namespace {

// zstd's fastest level: the columns are already delta and varint coded, and
// the writer must keep up with the recording on one core.
constexpr int kCompressionLevel = 1;

[[noreturn]] void io_error(const std::string& action, const std::filesystem::path& path, int error) {
  throw SnapshotError(ErrorCode::io, "cannot " + action + " " + path.string() + ": " + std::strerror(error));
}

void write_all(int fd, const std::byte* data, std::size_t size, const std::filesystem::path& path) {
  while (size > 0) {
    const ssize_t done = ::write(fd, data, size);
    if (done < 0) {
      if (errno == EINTR) continue;
      io_error("write stream", path, errno);
    }
    data += done;
    size -= static_cast<std::size_t>(done);
  }
}

std::vector<std::byte> head_bytes(const Snapshot& snapshot) {
  std::vector<std::byte> out;
  detail::SnapshotHead head{const_cast<Snapshot*>(&snapshot)};  // saving only reads
  detail::LittleEndianOutputArchive archive(out);
  archive(head);
  return out;
}

// What the start chunk and the trailer both hold: the header, the devices,
// the settings and a layout (the tables go in tables chunks).
Snapshot chunk_head(const Snapshot& from) {
  Snapshot head;
  head.header = from.header;
  head.devices = from.devices;
  head.settings = from.settings;
  head.segments = from.segments;
  return head;
}

}  // namespace

StreamFileWriter::StreamFileWriter(const std::filesystem::path& path, const Snapshot& start)
    : StreamFileWriter(path) {
  this->start(start);
}

StreamFileWriter::StreamFileWriter(const std::filesystem::path& path) : path_(path) {
  compressor_ = ZSTD_createCCtx();
  if (compressor_ == nullptr) throw std::bad_alloc();
  ZSTD_CCtx_setParameter(static_cast<ZSTD_CCtx*>(compressor_), ZSTD_c_compressionLevel, kCompressionLevel);
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    const int error = errno;
    ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(compressor_));
    io_error("create stream", path, error);
  }
  try {
    std::vector<std::byte> framing(detail::kFramingSize);
    const std::array<unsigned char, 8> magic = {0x89, 'C', 'A', 'S', 'N', 'A', 'P', '\n'};
    for (std::size_t i = 0; i < magic.size(); ++i) framing[i] = std::byte{magic[i]};
    for (std::size_t i = 0; i < 4; ++i) framing[8 + i] = static_cast<std::byte>((kStreamFormatVersion >> (8 * i)) & 0xff);
    for (std::size_t i = 0; i < 8; ++i) framing[16 + i] = std::byte{0xff};  // kStreamedBodySize
    write_all(fd_, framing.data(), framing.size(), path_);
    bytes_ = framing.size();
  } catch (...) {
    ::close(fd_);
    ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(compressor_));
    throw;
  }
}

void StreamFileWriter::start(const Snapshot& start) {
  write_chunk(static_cast<std::uint32_t>(detail::ChunkKind::start), 0, head_bytes(chunk_head(start)));
}

StreamFileWriter::~StreamFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(compressor_));
}

void StreamFileWriter::write_chunk(std::uint32_t kind, std::uint32_t events, const std::vector<std::byte>& raw) {
  if (fd_ < 0) io_error("write stream", path_, EBADF);
  if ((sequence_ == 0) != (kind == static_cast<std::uint32_t>(detail::ChunkKind::start))) {
    throw SnapshotError(ErrorCode::inconsistent, "inconsistent snapshot: a stream's start chunk is written once, first");
  }
  compressed_.resize(ZSTD_compressBound(raw.size()));
  const std::size_t stored = ZSTD_compress2(static_cast<ZSTD_CCtx*>(compressor_), compressed_.data(),
                                            compressed_.size(), raw.data(), raw.size());
  if (ZSTD_isError(stored)) {
    throw SnapshotError(ErrorCode::io, "cannot compress a chunk of " + path_.string() + ": " + ZSTD_getErrorName(stored));
  }
  detail::ChunkHeader header;
  header.kind = static_cast<detail::ChunkKind>(kind);
  header.events = events;
  header.stored_size = stored;
  header.raw_size = raw.size();
  header.sequence = sequence_;
  const std::span<const std::byte> payload(compressed_.data(), stored);
  // Header and payload in one write, so a kill leaves the file at a chunk
  // boundary or inside this chunk, never with a stray header.
  std::vector<std::byte> bytes = detail::chunk_header_bytes(header, payload);
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  write_all(fd_, bytes.data(), bytes.size(), path_);
  bytes_ += bytes.size();
  ++sequence_;
}

void StreamFileWriter::append_tables(const TableAppend& tables) {
  if (tables.empty()) return;
  auto check = [&](std::uint64_t first, std::uint64_t size, const char* table) {
    if (first != size) {
      throw SnapshotError(ErrorCode::inconsistent, std::string("inconsistent snapshot: tables appended to the ") +
                                                       table + " table at " + std::to_string(first) + ", which holds " +
                                                       std::to_string(size));
    }
  };
  check(tables.first_string, strings_, "string");
  check(tables.first_frame, frames_, "frame");
  check(tables.first_stack, stacks_, "stack");
  check(tables.first_thread, threads_, "thread");
  write_chunk(static_cast<std::uint32_t>(detail::ChunkKind::tables), 0, detail::encode_table_append(tables));
  strings_ += tables.strings.size();
  frames_ += tables.frames.size();
  stacks_ += tables.stacks.size();
  threads_ += tables.threads.size();
}

void StreamFileWriter::append_events(std::span<const Event> events) {
  std::vector<std::byte> raw;
  for (std::size_t first = 0; first < events.size(); first += kStreamBlockEvents) {
    const std::size_t count = std::min<std::size_t>(kStreamBlockEvents, events.size() - first);
    raw.clear();
    detail::LittleEndianOutputArchive archive(raw);
    archive(detail::encode_events(events.subspan(first, count)));
    write_chunk(static_cast<std::uint32_t>(detail::ChunkKind::events), static_cast<std::uint32_t>(count), raw);
    events_ += count;
  }
}

void StreamFileWriter::finish(const Snapshot& final_state) {
  Snapshot trailer = chunk_head(final_state);
  trailer.stats = final_state.stats;
  trailer.dropped_events = final_state.dropped_events;
  write_chunk(static_cast<std::uint32_t>(detail::ChunkKind::trailer), 0, head_bytes(trailer));
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int error = errno;
    ::close(fd);
    io_error("sync stream", path_, error);
  }
  if (::close(fd) != 0) io_error("close stream", path_, errno);
}

}  // namespace cachealloc::snapshot
