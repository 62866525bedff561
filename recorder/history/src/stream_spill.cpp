// StreamSpill: an unlinked file of spilled staging chunks (stream_spill.hpp).
#include "stream_spill.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "cachealloc/snapshot/format.hpp"
#include "history_state.hpp"

namespace cachealloc {

namespace {
int open_unlinked(const std::filesystem::path& directory) noexcept {
  const std::string dir = directory.empty() ? std::string(".") : directory.string();
#ifdef O_TMPFILE
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
#endif
  // Filesystems without O_TMPFILE: a named file, unlinked at once.
  std::string name = dir + "/.cachealloc-spill-XXXXXX";
  const int named = ::mkostemp(name.data(), O_CLOEXEC);
  if (named >= 0) ::unlink(name.c_str());
  return named;
}
}  // namespace

StreamSpill::StreamSpill(const std::filesystem::path& directory) noexcept : fd_(open_unlinked(directory)) {}

StreamSpill::~StreamSpill() {
  if (fd_ >= 0) ::close(fd_);
}

bool StreamSpill::append(const Chunk& chunk, std::uint64_t sequence) noexcept {
  if (fd_ < 0) return false;
  std::lock_guard lock(mutex_);
  const std::size_t bytes = chunk.used * sizeof(std::uint64_t);
  const char* from = reinterpret_cast<const char*>(chunk.words);
  for (std::size_t done = 0; done < bytes;) {
    const ssize_t n = ::pwrite(fd_, from + done, bytes - done, static_cast<off_t>(end_ + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  try {
    pieces_.push_back(Piece{end_, chunk.used, chunk.count.load(std::memory_order_relaxed), chunk.thread, chunk.base_ticks, sequence});
  } catch (...) {
    return false;
  }
  end_ += bytes;
  pending_events_ += pieces_.back().count;
  ++spilled_chunks_;
  return true;
}

std::vector<StreamSpill::Piece> StreamSpill::take() {
  std::lock_guard lock(mutex_);
  std::vector<Piece> out;
  out.swap(pieces_);
  pending_events_ = 0;
  return out;
}

void StreamSpill::read(const Piece& piece, std::vector<std::uint64_t>& out) const {
  out.resize(piece.used);
  const std::size_t bytes = piece.used * sizeof(std::uint64_t);
  char* to = reinterpret_cast<char*>(out.data());
  for (std::size_t done = 0; done < bytes;) {
    const ssize_t n = ::pread(fd_, to + done, bytes - done, static_cast<off_t>(piece.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw snapshot::SnapshotError(snapshot::ErrorCode::io,
                          std::string("cannot read back spilled events: ") + (n < 0 ? std::strerror(errno) : "short read"));
    done += static_cast<std::size_t>(n);
  }
}

void StreamSpill::recycle() noexcept {
  std::lock_guard lock(mutex_);
  if (!pieces_.empty() || end_ == 0) return;
  end_ = 0;
  if (::ftruncate(fd_, 0) != 0) {
    // The space stays taken until the next recycle; appends go on from 0.
  }
}

std::uint64_t StreamSpill::spilled_chunks() const noexcept {
  std::lock_guard lock(mutex_);
  return spilled_chunks_;
}

std::uint64_t StreamSpill::pending_events() const noexcept {
  std::lock_guard lock(mutex_);
  return pending_events_;
}

}  // namespace cachealloc
