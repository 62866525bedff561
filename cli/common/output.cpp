#include "output.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

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
  if (path.empty() || path == "-") return;
  path_ = std::move(path);
  struct stat info {};
  if (::stat(path_.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode)) cannot_write(path_, EISDIR);
    if (!S_ISREG(info.st_mode)) {
      // A device or a pipe (/dev/null, /dev/stdout, a fifo): written in place.
      errno = 0;
      file_.open(path_, std::ios::binary);
      if (!file_) cannot_write(path_, errno != 0 ? errno : EIO);
      return;
    }
    if (!force) throw UsageError("-o " + path_ + ": the file exists; add -f/--force to overwrite it");
  }
  temporary_ = path_ + ".tmp." + std::to_string(::getpid());
  errno = 0;
  file_.open(temporary_, std::ios::binary | std::ios::trunc);
  if (!file_) cannot_write(path_, errno != 0 ? errno : EIO);
}

Output::~Output() {
  if (!temporary_.empty() && !committed_) {
    file_.close();
    ::unlink(temporary_.c_str());
  }
}

std::ostream& Output::stream() { return path_.empty() ? std::cout : static_cast<std::ostream&>(file_); }

void Output::commit() {
  if (path_.empty()) {
    std::cout.flush();
    if (!std::cout) throw UsageError(std::string("cannot write to standard output: ") + std::strerror(errno != 0 ? errno : EIO));
    return;
  }
  errno = 0;
  file_.flush();
  if (!file_) cannot_write(path_, errno != 0 ? errno : EIO);
  file_.close();
  if (!file_) cannot_write(path_, errno != 0 ? errno : EIO);
  committed_ = temporary_.empty();
  if (committed_) return;  // written in place
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) cannot_write(path_, errno);
  committed_ = true;
}

}  // namespace cachealloc::cli
