// CACHEALLOC_HISTORY on a whole process: each case forks a child whose
// process-wide allocator is made after the variable is set (this process
// never makes its own, so every child starts without one).
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "cachealloc/cachealloc.h"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/stream.hpp"

using namespace cachealloc;
using snapshot::EventKind;

namespace {

// Runs `body` in a child with CACHEALLOC_HISTORY=`setting` on the simulated
// device; the child exits through exit() with body's status. Returns it.
template <typename Body>
int in_child(const std::string& setting, Body&& body) {
  std::fflush(nullptr);  // else the child flushes this process's buffered output again
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("CACHEALLOC_DEVICE", "simulated", 1);
    setenv("CACHEALLOC_HISTORY", setting.c_str(), 1);
    std::exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("CACHEALLOC_HISTORY streams a program's whole run, ended by exit() with the trailer") {
  // Given a program that only allocates through the C ABI
  const std::filesystem::path dir = CACHEALLOC_BINARY_DIR;
  const std::string pattern = (dir / "test_history_environment.{pid}.bin").string();
  const int rc = in_child("stream:" + pattern + ",stacks:none", [] {
    for (int i = 0; i < 5000; ++i) {
      void* p = cachealloc_malloc(static_cast<std::size_t>(1 + i % 5) << 20, 0);
      if (p == nullptr) return 1;
      cachealloc_free(p, 0, 0);
    }
    return 0;  // exit(): no stop, no dump: the variable alone
  });
  REQUIRE(rc == 0);
  // When the file named after the child's pid is read
  std::filesystem::path path;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().filename().string().starts_with("test_history_environment.")) path = entry.path();
  REQUIRE(!path.empty());
  const snapshot::Snapshot s = snapshot::read_snapshot(path);
  std::filesystem::remove(path);
  // Then every event is there, and the trailer with the final stats
  CHECK(s.header.format_version == snapshot::kStreamFormatVersion);
  CHECK(s.settings.count(snapshot::kStreamNoteSetting) == 0);
  CHECK(std::count_if(s.events.begin(), s.events.end(), [](const auto& e) { return e.kind == EventKind::alloc; }) ==
        5000);
  CHECK(s.stats.at("allocation.all.allocated") == 5000);
}

TEST_CASE("a bad CACHEALLOC_HISTORY fails the allocator with the variable's one-line error") {
  // Given a variable with a typo, when the program first allocates, then the
  // allocation fails with the one line, as a bad CACHEALLOC_CONF does
  const int rc = in_child("strem:/tmp/run.bin", [] {
    if (cachealloc_malloc(1 << 20, 0) != nullptr) return 1;
    const std::string error = cachealloc_last_error();
    return error == "CACHEALLOC_HISTORY: 'strem:/tmp/run.bin': unknown key (known: stream, stacks, max_frames, "
                    "stacks_on_free, clock, when_full, buffer_mb)"
               ? 0
               : 2;
  });
  CHECK(rc == 0);
}

TEST_CASE("a CACHEALLOC_HISTORY stream that cannot be created leaves the program running, unrecorded") {
  const int rc = in_child("stream:/nonexistent-directory/run.bin", [] {
    void* p = cachealloc_malloc(1 << 20, 0);
    if (p == nullptr) return 1;
    cachealloc_free(p, 0, 0);
    std::uint64_t written = 1;
    cachealloc_stream_progress(&written, nullptr);
    return written == 0 ? 0 : 2;
  });
  CHECK(rc == 0);
}
