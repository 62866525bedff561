// Whole-file reads and atomic writes for the pickle reader, the pickle writer
// and load(). format/snapshot_file.cpp keeps its own copy private; these two
// are small.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <vector>

namespace cachealloc::snapshot::pickle_file {

// The whole file. SnapshotError{io} naming `what`, the path and the reason.
std::vector<std::byte> read_all(const std::filesystem::path& path, const char* what);

// The whole file, to read once and drop: a big regular file is mapped
// (read-only, populated up front), which skips copying it and faulting in a
// buffer (~0.13 s of a 190 MB pickle); anything else (a pipe, /proc, a small
// file) is read with read_all(). The one cost of mapping: if another process
// truncates the file while it is mapped, reading past the new end raises
// SIGBUS, as with any mmap-based reader (ripgrep, git). Our own writers
// replace files by rename and never truncate one in place.
class FileBytes {
 public:
  FileBytes(const std::filesystem::path& path, const char* what);
  ~FileBytes();
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  std::span<const std::byte> bytes() const noexcept { return bytes_; }

 private:
  void* mapping_ = nullptr;
  std::size_t mapped_size_ = 0;
  std::vector<std::byte> read_;
  std::span<const std::byte> bytes_;
};

// A temporary file beside `path`, fsync, rename: never half a file at `path`,
// and no temporary left behind on failure. SnapshotError{io} on failure.
void write_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes, const char* what);

}  // namespace cachealloc::snapshot::pickle_file
