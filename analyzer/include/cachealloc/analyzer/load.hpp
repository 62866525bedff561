// The one place where cachealloc-analyze turns a path into a Snapshot.
//
// load() sniffs the content, not the file name: cachealloc's binary format
// today; PyTorch's memory-snapshot pickles will be recognised here when their
// reader lands, and no caller will change.
//
// Errors: throws snapshot::SnapshotError (io, not_a_snapshot, newer_version,
// truncated, inconsistent, unsupported); what() is one line.
// Thread safety: reentrant.
#pragma once

#include <filesystem>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::analyzer {

snapshot::Snapshot load(const std::filesystem::path& path);

}  // namespace cachealloc::analyzer
