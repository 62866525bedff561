// Reading and writing cachealloc's binary snapshot format (docs/FORMAT.md).
//
// Compatibility rule: a reader reads every format version up to its own
// kFormatVersion and rejects a newer one with SnapshotError{newer_version},
// whose message names both versions.
//
// Thread safety: every function is reentrant; none keeps global state.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::snapshot {

// Bumped on any change of the on-disk layout.
inline constexpr std::uint32_t kFormatVersion = 1;

enum class ErrorCode {
  not_a_snapshot,  // bad magic: "not a cachealloc snapshot"
  newer_version,   // written by a newer format version than we read
  truncated,       // the data ends early
  inconsistent,    // counts or references that do not add up
  io,              // the file could not be opened, read or written
  unsupported,     // a well-formed input this reader does not handle
};

// Every failure to read or write a snapshot. what() is one line, fit to print
// after "error: ".
class SnapshotError : public std::runtime_error {
 public:
  SnapshotError(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Serializes `snapshot` into bytes. Throws SnapshotError{inconsistent} when the
// snapshot references a stack, frame or string that is not in its tables.
std::vector<std::byte> encode(const Snapshot& snapshot);

// Parses bytes produced by encode() of this or an older version.
// Throws SnapshotError with the matching ErrorCode.
Snapshot decode(std::span<const std::byte> bytes);

// Writes atomically: a temporary file beside `path`, fsync, then rename, so a
// crash never leaves half a snapshot and never destroys an existing file at
// `path` unless the new one is complete. Throws SnapshotError{io}.
void write_snapshot(const Snapshot& snapshot, const std::filesystem::path& path);

// Reads a file written by write_snapshot. Throws SnapshotError.
Snapshot read_snapshot(const std::filesystem::path& path);

// True when `bytes` begin with our magic.
bool has_snapshot_magic(std::span<const std::byte> bytes) noexcept;

}  // namespace cachealloc::snapshot
