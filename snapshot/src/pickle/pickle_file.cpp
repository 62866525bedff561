#include "pickle_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "cachealloc/snapshot/format.hpp"

namespace cachealloc::snapshot::pickle_file {

namespace {

[[noreturn]] void io_error(const std::string& action, const std::filesystem::path& path, int error) {
  throw SnapshotError(ErrorCode::io, "cannot " + action + " " + path.string() + ": " + std::strerror(error));
}

// Closes on every path out.
struct Descriptor {
  int fd = -1;
  explicit Descriptor(int value) : fd(value) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::vector<std::byte> read_all(const std::filesystem::path& path, const char* what) {
  const std::string action = std::string("read ") + what;
  Descriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.fd < 0) io_error("open " + std::string(what), path, errno);
  struct stat info {};
  if (::fstat(file.fd, &info) != 0) io_error(action, path, errno);
  if (S_ISDIR(info.st_mode)) io_error(action, path, EISDIR);
  // One read straight into the buffer when the size is known (a copy per
  // 64 KiB chunk cost ~5% of reading a 200 MB pickle); then read to the end
  // anyway, since pipes and /proc files lie about their size.
  std::vector<std::byte> bytes;
  std::size_t filled = 0;
  if (S_ISREG(info.st_mode) && info.st_size > 0) {
    bytes.resize(static_cast<std::size_t>(info.st_size));
  }
  std::array<std::byte, 1 << 16> chunk{};
  for (;;) {
    // Into the buffer while it has room, then through `chunk`: growing the
    // buffer just to learn that the file ended would copy all of it.
    const bool room = filled < bytes.size();
    const ssize_t got = room ? ::read(file.fd, bytes.data() + filled, bytes.size() - filled)
                             : ::read(file.fd, chunk.data(), chunk.size());
    if (got < 0) {
      if (errno == EINTR) continue;
      io_error(action, path, errno);
    }
    if (got == 0) break;
    if (!room) bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + got);
    filled += static_cast<std::size_t>(got);
  }
  bytes.resize(filled);
  return bytes;
}

FileBytes::FileBytes(const std::filesystem::path& path, const char* what) {
  // Below this, read() costs about what setting up a mapping does.
  constexpr off_t kMapAtLeast = off_t{16} << 20;
  {
    Descriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat info {};
    if (file.fd >= 0 && ::fstat(file.fd, &info) == 0 && S_ISREG(info.st_mode) && info.st_size >= kMapAtLeast) {
      const auto size = static_cast<std::size_t>(info.st_size);
      void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, file.fd, 0);
      if (mapping != MAP_FAILED) {
        ::madvise(mapping, size, MADV_SEQUENTIAL);
        mapping_ = mapping;
        mapped_size_ = size;
        bytes_ = std::span<const std::byte>(static_cast<const std::byte*>(mapping), size);
        return;
      }
    }
  }
  // Every error (missing file, directory, permissions) is reported by read_all.
  read_ = read_all(path, what);
  bytes_ = read_;
}

FileBytes::~FileBytes() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapped_size_);
}

void write_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes, const char* what) {
  const std::string action = std::string("write ") + what;
  static std::atomic<unsigned> counter{0};
  std::filesystem::path temporary;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    temporary = path;
    temporary += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) io_error(action, path, errno);
  }
  if (fd < 0) io_error(action, path, EEXIST);
  Descriptor file(fd);
  bool renamed = false;
  struct Cleanup {
    const std::filesystem::path& path;
    const bool& done;
    ~Cleanup() {
      if (!done) ::unlink(path.c_str());
    }
  } cleanup{temporary, renamed};
  while (!bytes.empty()) {
    const ssize_t written = ::write(file.fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      io_error(action, path, errno);
    }
    bytes = bytes.subspan(static_cast<std::size_t>(written));
  }
  if (::fsync(file.fd) != 0) io_error(action, path, errno);
  const int closed = ::close(file.fd);
  file.fd = -1;
  if (closed != 0) io_error(action, path, errno);
  if (::rename(temporary.c_str(), path.c_str()) != 0) io_error(action, path, errno);
  renamed = true;
}

}  // namespace cachealloc::snapshot::pickle_file
