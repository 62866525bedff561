// Whole-file reads and atomic writes for the pickle reader, the pickle writer
// and load(). format.cpp keeps its own copy private; these two are small.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <vector>

namespace cachealloc::snapshot::pickle_file {

// The whole file. SnapshotError{io} naming `what`, the path and the reason.
std::vector<std::byte> read_all(const std::filesystem::path& path, const char* what);

// A temporary file beside `path`, fsync, rename: never half a file at `path`,
// and no temporary left behind on failure. SnapshotError{io} on failure.
void write_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes, const char* what);

}  // namespace cachealloc::snapshot::pickle_file
