#include "output.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <vector>

#include "conventions.hpp"

namespace cachealloc::cli {

namespace {

[[noreturn]] void cannot_write(const std::string& path, int error) {
  throw UsageError("cannot write " + path + ": " + std::strerror(error));
}

}  // namespace

bool Output::names_directory(const std::string& path) {
  if (!path.empty() && path.back() == '/') return true;
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

Output::Output(std::string path, bool force) {
  if (path.empty() || path == "-") {
    hold(STDOUT_FILENO);
    return;
  }
  path_ = std::move(path);
  struct stat info {};
  if (::stat(path_.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode)) cannot_write(path_, EISDIR);
    if (!S_ISREG(info.st_mode)) {
      // A device or a pipe (/dev/null, /dev/stdout, a fifo): written in
      // place, like stdout, once the run has succeeded.
      const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0) cannot_write(path_, errno);
      hold(fd);
      return;
    }
    if (!force) throw UsageError("-o " + path_ + ": the file exists; add -f/--force to overwrite it");
  }
  temporary_ = path_ + ".tmp." + std::to_string(::getpid());
  errno = 0;
  file_.open(temporary_, std::ios::binary | std::ios::trunc);
  if (!file_) cannot_write(path_, errno != 0 ? errno : EIO);
}

void Output::hold(int target_fd) {
  target_fd_ = target_fd;
  std::error_code error;
  std::string name = std::filesystem::temp_directory_path(error).string();
  if (error) name = "/tmp";
  name += "/cachealloc-output-XXXXXX";
  const int fd = ::mkstemp(name.data());
  if (fd >= 0) {
    file_.open(name, std::ios::binary | std::ios::trunc);
    ::unlink(name.c_str());
    if (file_) {
      held_fd_ = fd;
      return;
    }
    ::close(fd);
  }
  // No temporary folder to write to: the text waits in memory instead.
  held_in_memory_ = std::make_unique<std::ostringstream>();
}

Output::~Output() {
  if (held_fd_ >= 0) ::close(held_fd_);
  if (target_fd_ >= 0 && target_fd_ != STDOUT_FILENO) ::close(target_fd_);
  if (!temporary_.empty() && !committed_) {
    file_.close();
    ::unlink(temporary_.c_str());
  }
}

std::ostream& Output::stream() {
  if (held_in_memory_) return *held_in_memory_;
  return file_;
}

void Output::copy_held() {
  const auto fail = [&](int error) {
    if (path_.empty()) throw UsageError(std::string("cannot write to standard output: ") + std::strerror(error));
    cannot_write(path_, error);
  };
  const auto write_all = [&](const char* data, std::size_t size) {
    while (size > 0) {
      const ssize_t wrote = ::write(target_fd_, data, size);
      if (wrote < 0) {
        if (errno == EINTR) continue;
        fail(errno);
      }
      data += wrote;
      size -= static_cast<std::size_t>(wrote);
    }
  };
  std::cout.flush();  // whatever reached std::cout itself goes first
  if (held_in_memory_) {
    const std::string text = held_in_memory_->str();
    write_all(text.data(), text.size());
    return;
  }
  errno = 0;
  file_.flush();
  if (!file_) fail(errno != 0 ? errno : EIO);
  std::vector<char> buffer(std::size_t{1} << 20);
  for (off_t offset = 0;;) {
    const ssize_t got = ::pread(held_fd_, buffer.data(), buffer.size(), offset);
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(errno);
    }
    if (got == 0) break;
    write_all(buffer.data(), static_cast<std::size_t>(got));
    offset += got;
  }
}

void Output::commit() { commit({}); }

void Output::commit(const std::function<void(const std::string& written)>& verify) {
  if (committed_) return;
  if (target_fd_ >= 0) {
    if (verify) verify("");
    copy_held();
    committed_ = true;
    return;
  }
  errno = 0;
  file_.flush();
  if (!file_) cannot_write(path_, errno != 0 ? errno : EIO);
  file_.close();
  if (!file_) cannot_write(path_, errno != 0 ? errno : EIO);
  if (verify) verify(temporary_);  // on a throw the destructor removes the temporary
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) cannot_write(path_, errno);
  committed_ = true;
}

}  // namespace cachealloc::cli
