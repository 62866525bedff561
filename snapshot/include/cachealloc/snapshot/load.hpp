// One entry point for every file a cachealloc tool reads.
//
// load() recognizes the file by its content, never its name: our binary
// format by its magic (format.hpp), a PyTorch memory snapshot by the pickle
// PROTO opcode followed by a protocol from 2 to 5 (pickle.hpp). The path
// "-" is standard input; gzip and zstd inputs are decompressed first; the
// header is checked before the rest is read (input.hpp).
//
// Errors: SnapshotError{io} naming the path when it cannot be read;
// SnapshotError{not_a_snapshot, "not a cachealloc snapshot or PyTorch memory
// snapshot"} when neither is recognized (callers name the path); otherwise whatever the chosen
// reader throws (newer_version, truncated, inconsistent, unsupported).
// Thread safety: reentrant.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::snapshot {

Snapshot load(const std::filesystem::path& path);

// load() on bytes already in memory.
Snapshot load(std::span<const std::byte> bytes);

}  // namespace cachealloc::snapshot
