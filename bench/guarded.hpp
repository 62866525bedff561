// A benchmark's body, with its errors as one line on stderr: a file that
// cannot be read or a refused argument is bad input (exit 2), anything else
// a failure (exit 1). For the benchmarks that link the recorder.
#pragma once

#include <cstdio>
#include <exception>
#include <filesystem>

#include "args.hpp"
#include "cachealloc/errors.hpp"
#include "cachealloc/snapshot/format.hpp"

namespace cachealloc::bench {

// Runs a benchmark's body: an error becomes one line on stderr.
template <typename Body>
int guarded(const Args& args, Body&& body) {
  try {
    return body();
  } catch (const snapshot::SnapshotError& error) {
    std::fprintf(stderr, "%s: error: %s\n", args.name().c_str(), error.what());
    return 2;
  } catch (const InvalidArgument& error) {
    std::fprintf(stderr, "%s: error: %s\n", args.name().c_str(), error.what());
    return 2;
  } catch (const std::filesystem::filesystem_error& error) {
    std::fprintf(stderr, "%s: error: %s\n", args.name().c_str(), error.what());
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: failed: %s\n", args.name().c_str(), error.what());
    return 1;
  }
}

}  // namespace cachealloc::bench
