// Snapshot files: a whole-file read, and an atomic write (a temporary file,
// fsync, rename), so that a reader never sees half a snapshot.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "cachealloc/snapshot/format.hpp"
#include "huge_pages.hpp"

namespace cachealloc::snapshot {
namespace {

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

}  // namespace

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

}  // namespace cachealloc::snapshot
