#include "cachealloc/analyzer/load.hpp"

#include "cachealloc/snapshot/load.hpp"

namespace cachealloc::analyzer {

// snapshot::load() sniffs the content: our format or a PyTorch pickle.
snapshot::Snapshot load(const std::filesystem::path& path) { return snapshot::load(path); }

}  // namespace cachealloc::analyzer
