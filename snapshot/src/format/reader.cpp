#include "cachealloc/snapshot/reader.hpp"

#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/input.hpp"
#include "cachealloc/snapshot/load.hpp"
#include "format_v3.hpp"
#include "stream_format.hpp"

namespace cachealloc::snapshot {

struct SnapshotReader::Columns {
  detail::EventColumns value;
};
struct SnapshotReader::StreamChunks {
  std::vector<detail::StreamEventChunk> chunks;
};
struct SnapshotReader::StreamBuffers {
  detail::ChunkBuffers buffers;
};

namespace {

// Slices of a loaded snapshot as blocks: the same size as a file's blocks,
// so callers see one block size whatever they read.
constexpr std::uint64_t kLoadedBlockEvents = detail::kBlockEvents;

[[noreturn]] void io_error(const std::string& action, const std::filesystem::path& path, int error) {
  throw SnapshotError(ErrorCode::io, "cannot " + action + " " + path.string() + ": " + std::strerror(error));
}

// The open file, up to the size it had when the reader opened it (a stream
// still being written grows behind it).
class FileSource final : public detail::ByteSource {
 public:
  FileSource(std::FILE* file, std::uint64_t size, const std::filesystem::path& path)
      : file_(file), size_(size), path_(path) {}
  std::uint64_t size() const override { return size_; }
  void read(void* data, std::size_t size, std::uint64_t offset) override {
    if (::fseeko(file_, static_cast<off_t>(offset), SEEK_SET) != 0) io_error("read snapshot", path_, errno);
    if (std::fread(data, 1, size, file_) != size) {
      if (std::ferror(file_)) io_error("read snapshot", path_, errno);
      detail::truncated("the file ends before offset " + std::to_string(offset + size) + "; did it shrink?");
    }
  }

 private:
  std::FILE* file_;
  std::uint64_t size_;
  const std::filesystem::path& path_;
};

}  // namespace

SnapshotReader::SnapshotReader() : columns_(std::make_unique<Columns>()) {}

SnapshotReader::SnapshotReader(const std::filesystem::path& path) : SnapshotReader() { open(path); }

SnapshotReader::~SnapshotReader() {
  if (file_ != nullptr) std::fclose(file_);
}

void SnapshotReader::open(const std::filesystem::path& path) {
  if (file_ != nullptr) std::fclose(file_);
  file_ = nullptr;
  head_ = Snapshot{};
  shared_head_ = nullptr;
  path_ = path;
  event_count_ = 0;
  block_first_.clear();
  block_offset_.clear();
  block_size_.clear();
  events_.clear();
  stream_chunks_.reset();
  next_ = 0;

  // Stream only a regular file of ours at version 3 or newer (4 differs from
  // 3 only inside the head, which decode_head() reads; a newer one is
  // rejected by the framing check, naming both versions); load() takes the
  // rest and reports every error as it always has.
  bool ours = false;
  struct stat info {};
  if (!is_standard_input(path) && ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode)) {
    if (std::FILE* probe = std::fopen(path.c_str(), "rb")) {
      std::array<std::byte, 12> prefix{};
      const std::size_t got = std::fread(prefix.data(), 1, prefix.size(), probe);
      std::fclose(probe);
      ours = got == prefix.size() && has_snapshot_magic(prefix) && detail::read_u32(prefix, 8) >= 3;
    }
  }
  try {
    if (ours) {
      open_streaming(path, static_cast<std::uint64_t>(info.st_size));
      return;
    }
    head_ = load(path);
  } catch (...) {
    if (file_ != nullptr) std::fclose(file_);
    file_ = nullptr;
    head_ = Snapshot{};
    throw;
  }
  events_ = std::move(head_.events);
  head_.events = {};
  event_count_ = events_.size();
  for (std::uint64_t first = 0; first < event_count_; first += kLoadedBlockEvents) block_first_.push_back(first);
}

void SnapshotReader::open_sibling(const SnapshotReader& other) {
  if (!other.streaming()) throw std::logic_error("open_sibling: the other reader does not stream a file");
  if (file_ != nullptr) std::fclose(file_);
  file_ = nullptr;
  head_ = Snapshot{};
  events_.clear();
  next_ = 0;
  path_ = other.path_;
  // The file the other reader has open, not whatever the path names now
  // (the file may have been replaced or removed since): a new open file
  // description of it through /proc, so that the two readers' offsets are
  // their own; without /proc, the path, if it is still the same file.
  const std::string own = "/proc/self/fd/" + std::to_string(::fileno(other.file_));
  file_ = std::fopen(own.c_str(), "rb");
  if (file_ == nullptr) {
    file_ = std::fopen(path_.c_str(), "rb");
    if (file_ == nullptr) io_error("open snapshot", path_, errno);
    struct stat mine {}, theirs {};
    if (::fstat(::fileno(file_), &mine) != 0 || ::fstat(::fileno(other.file_), &theirs) != 0 ||
        mine.st_dev != theirs.st_dev || mine.st_ino != theirs.st_ino) {
      std::fclose(file_);
      file_ = nullptr;
      throw SnapshotError(ErrorCode::io, "cannot read " + path_.string() + " again: it is not the file opened");
    }
  }
  shared_head_ = &other.head();
  stream_chunks_ = other.stream_chunks_;
  event_count_ = other.event_count_;
  block_first_ = other.block_first_;
  block_offset_ = other.block_offset_;
  block_size_ = other.block_size_;
}

void SnapshotReader::read_exactly(void* data, std::size_t size, std::uint64_t offset) {
  if (::fseeko(file_, static_cast<off_t>(offset), SEEK_SET) != 0) io_error("read snapshot", path_, errno);
  if (std::fread(data, 1, size, file_) != size) {
    if (std::ferror(file_)) io_error("read snapshot", path_, errno);
    detail::truncated("the file ends before offset " + std::to_string(offset + size) + "; did it shrink?");
  }
}

void SnapshotReader::open_streaming(const std::filesystem::path& path, std::uint64_t file_size) {
  file_ = std::fopen(path.c_str(), "rb");
  if (file_ == nullptr) io_error("open snapshot", path, errno);
  std::array<std::byte, detail::kFramingSize> framing{};
  read_exactly(framing.data(), std::min<std::uint64_t>(framing.size(), file_size), 0);
  const std::uint32_t version =
      detail::check_framing(std::span(framing).first(std::min<std::uint64_t>(framing.size(), file_size)), file_size);
  if (version == kStreamFormatVersion) {
    open_stream(file_size);
    return;
  }

  // The same checks, in the same order and with the same messages, as
  // decode_version3() in format.cpp.
  std::uint64_t at = detail::kFramingSize;
  auto left = [&] { return file_size - at; };
  std::array<std::byte, 12> fixed{};
  if (left() < 8) detail::inconsistent("the body ends inside the head size");
  read_exactly(fixed.data(), 8, at);
  const std::uint64_t head_size = detail::read_u64(fixed, 0);
  at += 8;
  if (head_size > left()) {
    detail::inconsistent("a head of " + std::to_string(head_size) + " bytes at offset " + std::to_string(at) +
                         " exceeds the " + std::to_string(left()) + " bytes left");
  }
  {
    std::vector<std::byte> head(head_size);
    read_exactly(head.data(), head.size(), at);
    head_ = detail::decode_head(head, at);
  }
  at += head_size;
  if (left() < detail::kEventSectionHeaderSize) detail::inconsistent("the body ends inside the event section header");
  read_exactly(fixed.data(), detail::kEventSectionHeaderSize, at);
  at += detail::kEventSectionHeaderSize;
  const detail::EventSectionHeader section = detail::parse_event_section_header(fixed, left());
  event_count_ = section.event_count;
  for (const DeviceInfo& device : head_.devices) {
    for (const DeviceUsage& usage : device.usage) {
      if (usage.event != kUsageAtDump && usage.event >= event_count_) {
        detail::inconsistent("device " + std::to_string(device.index) + " has a usage reading at event " +
                             std::to_string(usage.event) + " of " + std::to_string(event_count_));
      }
    }
  }

  const std::uint64_t blocks = section.block_count();
  for (std::uint64_t block = 0; block < blocks; ++block) {
    if (left() < detail::kBlockHeaderSize) detail::inconsistent("the body ends before block " + std::to_string(block));
    read_exactly(fixed.data(), detail::kBlockHeaderSize, at);
    const std::uint64_t size = detail::read_u64(fixed, 0);
    at += detail::kBlockHeaderSize;
    if (size > left()) {
      detail::inconsistent("block " + std::to_string(block) + " of " + std::to_string(size) + " bytes at offset " +
                           std::to_string(at) + " exceeds the " + std::to_string(left()) + " bytes left");
    }
    block_first_.push_back(block * section.block_events);
    block_offset_.push_back(at);
    block_size_.push_back(size);
    at += size;
  }
  if (left() != 0) detail::inconsistent(std::to_string(left()) + " unread bytes at the end of the body");
  validate(head_);
  head_.header.format_version = version;
}

void SnapshotReader::open_stream(std::uint64_t file_size) {
  FileSource source(file_, file_size, path_);
  detail::StreamIndex index = detail::index_stream(source);
  head_ = std::move(index.head);
  event_count_ = index.event_count;
  for (const detail::StreamEventChunk& chunk : index.chunks) {
    block_first_.push_back(chunk.first_event);
    block_offset_.push_back(chunk.offset);
    block_size_.push_back(chunk.header.stored_size);
  }
  auto chunks = std::make_shared<StreamChunks>();
  chunks->chunks = std::move(index.chunks);
  stream_chunks_ = std::move(chunks);
}

void SnapshotReader::read_block(std::size_t block, std::vector<Event>& out) {
  if (block >= block_first_.size()) {
    throw SnapshotError(ErrorCode::inconsistent, "inconsistent snapshot: block " + std::to_string(block) +
                                                     " asked of " + std::to_string(block_first_.size()));
  }
  const std::uint64_t first = block_first_[block];
  const std::uint64_t count = block_first_event(block + 1) - first;
  if (file_ == nullptr) {
    const auto begin = events_.begin() + static_cast<std::ptrdiff_t>(first);
    out.assign(begin, begin + static_cast<std::ptrdiff_t>(count));
    return;
  }
  if (stream_chunks_) {
    if (!stream_buffers_) stream_buffers_ = std::make_unique<StreamBuffers>();
    FileSource source(file_, ~std::uint64_t{0}, path_);
    detail::read_events_chunk(source, stream_chunks_->chunks[block], block, head(), stream_buffers_->buffers, out);
    return;
  }
  bytes_.resize(block_size_[block]);
  read_exactly(bytes_.data(), bytes_.size(), block_offset_[block]);
  detail::EventScreen screen = detail::event_screen(head());
  detail::decode_block(bytes_, block_offset_[block], block, count, columns_->value, out, &screen);
  if (screen.flagged) detail::validate_events(head(), out, first);
}

bool SnapshotReader::next_block(std::vector<Event>& out) {
  if (next_ >= block_first_.size()) {
    out.clear();
    return false;
  }
  read_block(next_, out);
  ++next_;
  return true;
}

}  // namespace cachealloc::snapshot
