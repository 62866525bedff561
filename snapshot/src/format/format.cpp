#include "cachealloc/snapshot/format.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "cachealloc/snapshot/invariants.hpp"
#include "cachealloc/snapshot/ring_start.hpp"

#include "archive.hpp"
#include "format_v3.hpp"
#include "huge_pages.hpp"
#include "serialize.hpp"

namespace cachealloc::snapshot {
namespace {

// The framing (docs/FORMAT.md, "Framing"). 0x89 is not ASCII, so a text
// tool that strips the high bit breaks the magic; '\n' catches newline
// translation.
constexpr std::array<std::byte, 8> kMagic = {std::byte{0x89}, std::byte{'C'}, std::byte{'A'}, std::byte{'S'},
                                              std::byte{'N'},  std::byte{'A'}, std::byte{'P'}, std::byte{'\n'}};
constexpr std::size_t kVersionOffset = 8;
constexpr std::size_t kReservedOffset = 12;
constexpr std::size_t kBodySizeOffset = 16;
using detail::inconsistent;
using detail::kFramingSize;
using detail::truncated;

template <class T>
void put_le(std::vector<std::byte>& out, std::size_t offset, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out[offset + i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
  }
}
template <class T>
T get_le(std::span<const std::byte> bytes, std::size_t offset) {
  T value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(std::to_integer<T>(bytes[offset + i]) << (8 * i));
  return value;
}

// --- validation ----------------------------------------------------------

void check_stack(StackId id, const Snapshot& snapshot, const std::string& where) {
  if (id.value != 0 && id.value >= snapshot.stacks.size()) {
    inconsistent(where + " references stack " + std::to_string(id.value) + " but the stack table has " +
                 std::to_string(snapshot.stacks.size()) + " entries");
  }
}
void check_string(StringId id, const Snapshot& snapshot, const std::string& where) {
  if (id.value != 0 && id.value >= snapshot.strings.size()) {
    inconsistent(where + " references string " + std::to_string(id.value) + " but the string table has " +
                 std::to_string(snapshot.strings.size()) + " entries");
  }
}

// The segments of a layout and their blocks; `suffix` says which layout in
// messages ("" for the final one).
// NVML's readings: a known source, figures within the device, OOM readings
// in event order naming an OOM event, the dump's reading last. The events
// are checked only when they are here (a streaming reader checks the index
// against its event count, reader.cpp).
void check_usage(const Snapshot& snapshot) {
  for (const DeviceInfo& device : snapshot.devices) {
    const std::string where = "device " + std::to_string(device.index);
    if (static_cast<int>(device.usage_source) > static_cast<int>(UsageSource::unavailable))
      inconsistent(where + " has unknown usage source " + std::to_string(static_cast<int>(device.usage_source)));
    if (!device.usage.empty() && device.usage_source != UsageSource::nvml &&
        device.usage_source != UsageSource::simulated)
      inconsistent(where + " holds usage readings but its usage source is " + to_string(device.usage_source));
    for (std::size_t i = 0; i < device.usage.size(); ++i) {
      const DeviceUsage& u = device.usage[i];
      const std::string which = where + " usage reading " + std::to_string(i);
      if (u.device_used > u.device_total || u.device_reserved > u.device_total - u.device_used ||
          (u.process_found && u.process_used > u.device_total) || u.other_processes_used > u.device_total)
        inconsistent(which + " has figures beyond the device's total of " + std::to_string(u.device_total) + " bytes");
      if (u.event == kUsageAtDump) {
        if (i + 1 != device.usage.size()) inconsistent(which + " is the dump's but not the last");
        continue;
      }
      if (i > 0 && u.event <= device.usage[i - 1].event)
        inconsistent(which + " names event " + std::to_string(u.event) + ", not after the previous reading's");
      if (!snapshot.events.empty() &&
          (u.event >= snapshot.events.size() || snapshot.events[u.event].kind != EventKind::oom))
        inconsistent(which + " names event " + std::to_string(u.event) + ", which is not an OOM of the trace");
    }
  }
}

void check_layout(const std::vector<Segment>& segments, const Snapshot& snapshot, const std::string& suffix) {
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const Segment& segment = segments[s];
    check_stack(segment.stack, snapshot, "segment " + std::to_string(s) + suffix);
    for (std::size_t b = 0; b < segment.blocks.size(); ++b) {
      const Block& block = segment.blocks[b];
      const std::string where = "block " + std::to_string(b) + " of segment " + std::to_string(s) + suffix;
      if (static_cast<std::uint8_t>(block.state) > static_cast<std::uint8_t>(BlockState::unmapped)) {
        inconsistent(where + " has unknown state " + std::to_string(static_cast<int>(block.state)));
      }
      check_stack(block.stack, snapshot, where);
    }
  }
}

// --- versions ------------------------------------------------------------

// Appends `value` little-endian.
template <class T>
void append_le(std::vector<std::byte>& out, T value) {
  out.resize(out.size() + sizeof(T));
  put_le<T>(out, out.size() - sizeof(T), value);
}

// Version 3: the head, then the events in blocks (docs/FORMAT.md).
Snapshot decode_version3(std::span<const std::byte> body) {
  std::size_t at = 0;
  auto file_offset = [&] { return kFramingSize + at; };
  if (body.size() < 8) inconsistent("the body ends inside the head size");
  const std::uint64_t head_size = detail::read_u64(body, at);
  at += 8;
  if (head_size > body.size() - at) {
    inconsistent("a head of " + std::to_string(head_size) + " bytes at offset " + std::to_string(file_offset()) +
                 " exceeds the " + std::to_string(body.size() - at) + " bytes left");
  }
  Snapshot snapshot = detail::decode_head(body.subspan(at, head_size), file_offset());
  at += head_size;
  if (body.size() - at < detail::kEventSectionHeaderSize) inconsistent("the body ends inside the event section header");
  const detail::EventSectionHeader events =
      detail::parse_event_section_header(body.subspan(at, detail::kEventSectionHeaderSize),
                                         body.size() - at - detail::kEventSectionHeaderSize);
  at += detail::kEventSectionHeaderSize;
  // parse_event_section_header bounded event_count by the bytes left.
  detail::reserve_with_huge_pages(snapshot.events, events.event_count);
  detail::EventColumns columns;
  std::vector<Event> block_events;
  for (std::uint64_t block = 0; block < events.block_count(); ++block) {
    if (body.size() - at < detail::kBlockHeaderSize) inconsistent("the body ends before block " + std::to_string(block));
    const std::uint64_t size = detail::read_u64(body, at);
    at += detail::kBlockHeaderSize;
    if (size > body.size() - at) {
      inconsistent("block " + std::to_string(block) + " of " + std::to_string(size) + " bytes at offset " +
                   std::to_string(file_offset()) + " exceeds the " + std::to_string(body.size() - at) +
                   " bytes left");
    }
    detail::decode_block(body.subspan(at, size), file_offset(), block, events.events_in_block(block), columns,
                         block_events);
    snapshot.events.insert(snapshot.events.end(), block_events.begin(), block_events.end());
    at += size;
  }
  if (at != body.size()) inconsistent(std::to_string(body.size() - at) + " unread bytes at the end of the body");
  return snapshot;
}

// One branch per top-level body layout this reader understands. A per-type
// change is handled by that type's cereal class version instead
// (serialize.hpp): version 2 changed only the event encoding, which travels
// as EventColumns' class version, so it shares version 1's branch.
Snapshot decode_body(std::uint32_t version, std::span<const std::byte> body) {
  Snapshot snapshot;
  switch (version) {
    case 1:
    case 2: {
      detail::BoundedInputArchive archive(body, kFramingSize);
      try {
        archive(snapshot);
      } catch (const cereal::Exception& error) {
        inconsistent(error.what());
      }
      if (archive.remaining() != 0) {
        inconsistent(std::to_string(archive.remaining()) + " unread bytes at the end of the body");
      }
      break;
    }
    // Version 4 only adds the ring start to the head, which SnapshotHead's
    // class version tells decode_head().
    case 3:
    case 4:
    // Version 5 only adds NVML's readings to DeviceInfo (its class version).
    case 5:
    // Version 6 only changes the event encoding (EventColumns' class version).
    case 6: snapshot = decode_version3(body); break;
    default: inconsistent("format version " + std::to_string(version) + " does not exist");
  }
  snapshot.header.format_version = version;
  return snapshot;
}

// --- files ---------------------------------------------------------------

[[noreturn]] void io_error(const std::string& action, const std::filesystem::path& path, int error) {
  throw SnapshotError(ErrorCode::io, "cannot " + action + " " + path.string() + ": " + std::strerror(error));
}

// Owns a descriptor so every error path closes it.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }
  // Returns close()'s errno, 0 on success: on NFS a failed close can be the
  // only report of a failed write.
  int close() noexcept {
    const int result = ::close(fd_);
    fd_ = -1;
    return result == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

// Removes the temporary file unless the rename succeeded.
class TemporaryFile {
 public:
  explicit TemporaryFile(std::filesystem::path path) : path_(std::move(path)) {}
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  const std::filesystem::path& path() const noexcept { return path_; }
  void release() noexcept { path_.clear(); }

 private:
  std::filesystem::path path_;
};

int write_all(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    bytes = bytes.subspan(static_cast<std::size_t>(written));
  }
  return 0;
}

// The rename is durable only once the directory entry is on disk. Best effort:
// some filesystems refuse fsync on a directory, and the data is safe anyway.
void sync_directory(const std::filesystem::path& directory) noexcept {
  const int fd = ::open(directory.empty() ? "." : directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Writes a u64 placeholder, runs `write`, then stores the bytes it appended
// in the placeholder.
template <class Write>
void sized_section(std::vector<std::byte>& out, Write&& write) {
  const std::size_t size_at = out.size();
  append_le<std::uint64_t>(out, 0);
  write();
  put_le<std::uint64_t>(out, size_at, out.size() - size_at - 8);
}

// Version 5's layout is version 6's but for the event encoding.
std::vector<std::byte> encode_framed(const Snapshot& snapshot, std::uint32_t version = kFormatVersion) {
  if (version != kFormatVersion && version != 5) {
    inconsistent("format version " + std::to_string(version) + " cannot be written");
  }
  const std::uint32_t encoding = version == 5 ? 2 : detail::kEventEncoding;
  std::vector<std::byte> out(kFramingSize);
  std::copy(kMagic.begin(), kMagic.end(), out.begin());
  put_le<std::uint32_t>(out, kVersionOffset, version);
  put_le<std::uint32_t>(out, kReservedOffset, 0);
  sized_section(out, [&] {
    // Saving only reads through the pointer.
    detail::SnapshotHead head{const_cast<Snapshot*>(&snapshot)};
    // Derived here, once, so every writer (the recorder's dump, convert)
    // stores it; one backward pass over the events in memory per device.
    std::vector<RingStart> derived;
    if (snapshot.ring_start.empty() && snapshot.dropped_events > 0) {
      derived = derive_ring_starts(snapshot);
      head.ring_start = &derived;
    }
    detail::LittleEndianOutputArchive archive(out);
    archive(head);
  });
  const std::span<const Event> events(snapshot.events);
  append_le<std::uint64_t>(out, events.size());
  append_le<std::uint32_t>(out, detail::kBlockEvents);
  for (std::size_t first = 0; first < events.size(); first += detail::kBlockEvents) {
    const std::size_t count = std::min<std::size_t>(detail::kBlockEvents, events.size() - first);
    sized_section(out, [&] {
      // A fresh archive per block: each block carries EventColumns' class
      // version and decodes alone.
      const std::size_t class_version_at = out.size();
      detail::LittleEndianOutputArchive archive(out);
      archive(detail::encode_events(events.subspan(first, count), encoding));
      // The archive opens with EventColumns' class version (u32), which
      // names the encoding: the older one is written by hand.
      if (encoding != detail::kEventEncoding) put_le<std::uint32_t>(out, class_version_at, encoding);
    });
  }
  put_le<std::uint64_t>(out, kBodySizeOffset, out.size() - kFramingSize);
  return out;
}

}  // namespace

void validate(const Snapshot& snapshot) {
  for (std::size_t i = 0; i < snapshot.frames.size(); ++i) {
    const Frame& frame = snapshot.frames[i];
    const std::string where = "frame " + std::to_string(i);
    check_string(frame.function, snapshot, where);
    check_string(frame.file, snapshot, where);
    check_string(frame.module, snapshot, where);
  }
  for (std::size_t i = 0; i < snapshot.stacks.size(); ++i) {
    for (const FrameId frame : snapshot.stacks[i].frames) {
      if (frame.value >= snapshot.frames.size()) {
        inconsistent("stack " + std::to_string(i) + " references frame " + std::to_string(frame.value) +
                     " but the frame table has " + std::to_string(snapshot.frames.size()) + " entries");
      }
    }
  }
  check_layout(snapshot.segments, snapshot, "");
  for (std::size_t r = 0; r < snapshot.ring_start.size(); ++r) {
    const RingStart& start = snapshot.ring_start[r];
    const std::string where = "ring start " + std::to_string(r);
    if (r > 0 && start.device <= snapshot.ring_start[r - 1].device) {
      inconsistent(where + " is for device " + std::to_string(start.device) + ", not after device " +
                   std::to_string(snapshot.ring_start[r - 1].device));
    }
    check_layout(start.segments, snapshot, " of " + where);
  }
  // The layout and text rules both readers share (invariants.hpp).
  if (const std::optional<std::string> problem = layout_problem(snapshot)) inconsistent(*problem);
  check_usage(snapshot);
  detail::validate_events(snapshot, snapshot.events, 0);
}

namespace {
// The full checks of one event, in their order; reached only for an event
// the screen in validate_events flags, which fails one of them.
[[gnu::noinline]] void validate_event(const Snapshot& snapshot, const Event& event, std::uint64_t i) {
  if (static_cast<int>(event.kind) >= kEventKindCount) {
    inconsistent("event " + std::to_string(i) + " has unknown kind " + std::to_string(static_cast<int>(event.kind)));
  }
  if (!snapshot.threads.empty() && event.thread >= snapshot.threads.size()) {
    inconsistent("event " + std::to_string(i) + " references thread " + std::to_string(event.thread) +
                 " but the thread table has " + std::to_string(snapshot.threads.size()) + " entries");
  }
  if (event.stack.value != 0 && event.stack.value >= snapshot.stacks.size()) {
    check_stack(event.stack, snapshot, "event " + std::to_string(i));
  }
  if (event.kind == EventKind::annotation_begin || event.kind == EventKind::annotation_end) {
    if (event.aux > UINT32_MAX) {
      inconsistent("event " + std::to_string(i) + " names annotation string " + std::to_string(event.aux) +
                   ", past 32 bits");
    }
    check_string(StringId{static_cast<std::uint32_t>(event.aux)}, snapshot, "event " + std::to_string(i));
  }
}
}  // namespace

// A branch-free screen of the cheap conditions (a chain of branches per
// event was 7% of a streaming analysis, session 9), and the full checks,
// with their messages, only for the events it flags. The streaming reader
// screens while decoding (EventScreen) and comes here only for a block
// that fails.
void detail::validate_events(const Snapshot& snapshot, std::span<const Event> events, std::uint64_t first_index) {
  const EventScreen limits = event_screen(snapshot);
  constexpr auto annotation_begin = static_cast<unsigned>(EventKind::annotation_begin);
  constexpr auto annotation_end = static_cast<unsigned>(EventKind::annotation_end);
  for (std::size_t k = 0; k < events.size(); ++k) {
    const Event& event = events[k];
    const auto kind = static_cast<unsigned>(static_cast<std::uint8_t>(event.kind));
    const bool flagged = (kind >= static_cast<unsigned>(kEventKindCount)) | (event.thread >= limits.thread_limit) |
                         ((event.stack.value != 0) & (event.stack.value >= limits.stack_limit)) |
                         (((kind == annotation_begin) | (kind == annotation_end)) & (event.aux != 0) &
                          (event.aux >= limits.string_limit));
    if (flagged) [[unlikely]]
      validate_event(snapshot, event, first_index + k);
  }
}

std::vector<std::byte> encode(const Snapshot& snapshot) {
  validate(snapshot);
  return encode_framed(snapshot);
}

std::vector<std::byte> detail::encode_unvalidated(const Snapshot& snapshot) { return encode_framed(snapshot); }

std::vector<std::byte> detail::encode_as_version(const Snapshot& snapshot, std::uint32_t format_version) {
  validate(snapshot);
  return encode_framed(snapshot, format_version);
}

bool has_snapshot_magic(std::span<const std::byte> bytes) noexcept {
  return bytes.size() >= kMagic.size() && std::equal(kMagic.begin(), kMagic.end(), bytes.begin());
}

std::uint32_t detail::check_framing(std::span<const std::byte> bytes, std::uint64_t total_size) {
  if (total_size == 0) truncated("the input is empty");
  const std::size_t magic_bytes = std::min(bytes.size(), kMagic.size());
  if (!std::equal(kMagic.begin(), kMagic.begin() + static_cast<std::ptrdiff_t>(magic_bytes), bytes.begin())) {
    throw SnapshotError(ErrorCode::not_a_snapshot, "not a cachealloc snapshot");
  }
  if (bytes.size() < kReservedOffset) truncated("the input ends inside the magic and version");
  const auto version = get_le<std::uint32_t>(bytes, kVersionOffset);
  // Checked before anything else a newer writer may have changed.
  if (version > kFormatVersion) {
    throw SnapshotError(ErrorCode::newer_version, "snapshot format version " + std::to_string(version) +
                                                      " is newer than this reader supports (" +
                                                      std::to_string(kFormatVersion) + "); upgrade cachealloc");
  }
  if (bytes.size() < kFramingSize) {
    truncated(std::to_string(total_size) + " bytes is shorter than the " + std::to_string(kFramingSize) +
              "-byte header");
  }
  if (const auto reserved = get_le<std::uint32_t>(bytes, kReservedOffset); reserved != 0) {
    inconsistent("reserved header field is " + std::to_string(reserved) + ", not 0");
  }
  const auto body_size = get_le<std::uint64_t>(bytes, kBodySizeOffset);
  const std::uint64_t present = total_size - kFramingSize;
  if (body_size > present) {
    truncated("the header announces a body of " + std::to_string(body_size) + " bytes but only " +
              std::to_string(present) + " follow");
  }
  if (body_size < present) {
    inconsistent(std::to_string(present - body_size) + " bytes follow the " + std::to_string(body_size) +
                 "-byte body the header announces");
  }
  return version;
}

Snapshot decode(std::span<const std::byte> bytes) {
  const std::uint32_t version =
      detail::check_framing(bytes.first(std::min(bytes.size(), kFramingSize)), bytes.size());
  Snapshot snapshot = decode_body(version, bytes.subspan(kFramingSize));
  validate(snapshot);
  return snapshot;
}

void write_snapshot(const Snapshot& snapshot, const std::filesystem::path& path) {
  const std::vector<std::byte> bytes = encode(snapshot);  // may throw: nothing is on disk yet

  // Beside the target, so rename() stays within one filesystem and is atomic.
  // open(O_EXCL) with 0666 lets the umask decide the final permissions, as
  // for any file the program creates; mkstemp would force 0600.
  static std::atomic<unsigned> counter{0};
  int fd = -1;
  std::filesystem::path temporary_path;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    temporary_path = path;
    temporary_path += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
    fd = ::open(temporary_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) io_error("write snapshot", path, errno);
  }
  if (fd < 0) io_error("write snapshot", path, EEXIST);
  TemporaryFile temporary(temporary_path);
  FileDescriptor file(fd);

  if (const int error = write_all(file.get(), bytes); error != 0) io_error("write snapshot", path, error);
  if (::fsync(file.get()) != 0) io_error("sync snapshot", path, errno);
  if (const int error = file.close(); error != 0) io_error("write snapshot", path, error);
  if (::rename(temporary.path().c_str(), path.c_str()) != 0) io_error("write snapshot", path, errno);
  temporary.release();
  sync_directory(path.parent_path());
}

Snapshot read_snapshot(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_error("open snapshot", path, errno);
  FileDescriptor file(fd);
  struct stat info {};
  if (::fstat(file.get(), &info) != 0) io_error("read snapshot", path, errno);
  if (S_ISDIR(info.st_mode)) io_error("read snapshot", path, EISDIR);

  // Read to the end rather than trusting st_size: pipes and /proc files lie.
  std::vector<std::byte> bytes;
  if (S_ISREG(info.st_mode) && info.st_size > 0)
    detail::reserve_with_huge_pages(bytes, static_cast<std::size_t>(info.st_size));
  std::array<std::byte, 1 << 16> buffer{};
  for (;;) {
    const ssize_t got = ::read(file.get(), buffer.data(), buffer.size());
    if (got < 0) {
      if (errno == EINTR) continue;
      io_error("read snapshot", path, errno);
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), buffer.begin(), buffer.begin() + got);
  }
  return decode(bytes);
}

// --- version 3 pieces (format_v3.hpp) --------------------------------------

void detail::inconsistent(const std::string& what) {
  throw SnapshotError(ErrorCode::inconsistent, "inconsistent snapshot: " + what);
}
void detail::truncated(const std::string& what) {
  throw SnapshotError(ErrorCode::truncated, "truncated snapshot: " + what);
}

std::uint64_t detail::read_u64(std::span<const std::byte> bytes, std::size_t offset) {
  return get_le<std::uint64_t>(bytes, offset);
}
std::uint32_t detail::read_u32(std::span<const std::byte> bytes, std::size_t offset) {
  return get_le<std::uint32_t>(bytes, offset);
}

Snapshot detail::decode_head(std::span<const std::byte> bytes, std::size_t file_offset) {
  Snapshot snapshot;
  BoundedInputArchive archive(bytes, file_offset);
  SnapshotHead head{&snapshot};
  try {
    archive(head);
  } catch (const cereal::Exception& error) {
    inconsistent(error.what());
  }
  if (archive.remaining() != 0) {
    inconsistent(std::to_string(archive.remaining()) + " unread bytes at the end of the head");
  }
  return snapshot;
}

detail::EventSectionHeader detail::parse_event_section_header(std::span<const std::byte> bytes,
                                                              std::uint64_t remaining) {
  EventSectionHeader header{read_u64(bytes, 0), read_u32(bytes, 8)};
  // Every event takes at least its flag byte: this bounds what a reader
  // reserves for the events by the size of the input.
  if (header.event_count > remaining) {
    inconsistent(std::to_string(header.event_count) + " events declared but only " + std::to_string(remaining) +
                 " bytes follow");
  }
  if (header.event_count != 0 && (header.block_events == 0 || header.block_events > kMaxBlockEvents)) {
    inconsistent("blocks of " + std::to_string(header.block_events) + " events; a reader takes 1 to " +
                 std::to_string(kMaxBlockEvents));
  }
  return header;
}

detail::EventScreen detail::event_screen(const Snapshot& tables) {
  EventScreen screen;
  screen.thread_limit = tables.threads.empty() ? UINT64_MAX : tables.threads.size();
  screen.stack_limit = tables.stacks.size();
  // An annotation's string id must also fit 32 bits (validate_events).
  screen.string_limit = std::min<std::uint64_t>(tables.strings.size(), std::uint64_t{1} << 32);
  return screen;
}

void detail::decode_block(std::span<const std::byte> bytes, std::size_t file_offset, std::uint64_t block,
                          std::uint64_t expected_events, EventColumns& columns, std::vector<Event>& out,
                          EventScreen* screen) {
  BoundedInputArchive archive(bytes, file_offset);
  try {
    archive(columns);
  } catch (const cereal::Exception& error) {
    inconsistent(error.what());
  }
  if (archive.remaining() != 0) {
    inconsistent(std::to_string(archive.remaining()) + " unread bytes at the end of block " + std::to_string(block));
  }
  decode_events_into(columns, out, screen);  // checks the count against the columns first
  if (columns.count != expected_events) {
    inconsistent("block " + std::to_string(block) + " holds " + std::to_string(columns.count) + " events, " +
                 std::to_string(expected_events) + " expected");
  }
}

}  // namespace cachealloc::snapshot
