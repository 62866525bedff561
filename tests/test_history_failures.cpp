// The recorder never disturbs its host: each failure below
// switches recording off with one line on stderr while the allocator goes on
// serving, and a dump killed by SIGKILL leaves the previous complete snapshot
// or the new one, never a torn file. OOMs from many threads at once are all
// in the dump.
#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "allocator_support.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/format.hpp"
// Private to the recorder: the symbolizer seam.
#include "../recorder/history/src/stack_symbols.hpp"

using namespace cachealloc;
using test_support::MiB;

// Allocations of the ring's chunks and the threads' buffers (cache-line
// aligned, 256 events or more) fail while set: a real std::bad_alloc from
// operator new, as when the host is out of memory.
namespace {
std::atomic<bool> g_fail_ring_allocations{false};
bool fails(std::size_t size, std::align_val_t align) noexcept {
  return g_fail_ring_allocations.load(std::memory_order_relaxed) && static_cast<std::size_t>(align) >= 64 &&
         size >= 256 * sizeof(cachealloc::snapshot::Event);
}
}  // namespace

void* operator new(std::size_t size) {
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t size, std::align_val_t align) {
  if (fails(size, align)) throw std::bad_alloc();
  const auto alignment = std::max(static_cast<std::size_t>(align), sizeof(void*));
  if (void* p = std::aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment)) return p;
  throw std::bad_alloc();
}
// GCC 12 takes these replacements' free for a mismatch with operator new
// (-Wmismatched-new-delete), though the new above is malloc's.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
// Every other form too, so that nothing is allocated by one allocator and
// freed by another (ASan's own nothrow new against this free: a mismatch).
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return std::malloc(size == 0 ? 1 : size); }
void* operator new(std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(size, align);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size) { return ::operator new(size); }
void* operator new[](std::size_t size, std::align_val_t align) { return ::operator new(size, align); }
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept { return ::operator new(size, tag); }
void* operator new[](std::size_t size, std::align_val_t align, const std::nothrow_t& tag) noexcept {
  return ::operator new(size, align, tag);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

namespace fs = std::filesystem;

fs::path scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::path(CACHEALLOC_BINARY_DIR) / ("test_history_failures." + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// What the code under `body` writes to stderr.
template <class Body>
std::string stderr_of(Body&& body) {
  std::fflush(stderr);
  const fs::path file = scratch() / "stderr";
  const int saved = ::dup(2);
  std::FILE* capture = std::fopen(file.c_str(), "w");
  ::dup2(::fileno(capture), 2);
  body();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::fclose(capture);
  std::ifstream in(file);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The allocator still serves: allocations succeed, are distinct, are freed,
// and its counters come back to what they were.
void check_allocator_serves(CachingAllocator& allocator) {
  const auto before = allocator.memory_stats().at("allocated_bytes.all.current");
  std::vector<void*> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(allocator.allocate(4096 + static_cast<std::size_t>(i) * 512));
  std::sort(blocks.begin(), blocks.end());
  CHECK(std::adjacent_find(blocks.begin(), blocks.end()) == blocks.end());
  CHECK(allocator.memory_stats().at("allocated_bytes.all.current") > before);
  for (void* p : blocks) allocator.deallocate(p);
  CHECK(allocator.memory_stats().at("allocated_bytes.all.current") == before);
}

std::size_t lines(const std::string& text) { return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')); }

void workload(CachingAllocator& allocator, int n) {
  std::vector<void*> live;
  for (int i = 0; i < n; ++i) {
    live.push_back(allocator.allocate(1024 + static_cast<std::size_t>(i % 17) * 4096));
    if (i % 3 == 2) {
      allocator.deallocate(live.front());
      live.erase(live.begin());
    }
  }
  for (void* p : live) allocator.deallocate(p);
}

}  // namespace

TEST_CASE("a dump onto a full disk (RLIMIT_FSIZE) fails with one line, stops recording, and keeps the previous file") {
  // Given a recorder with a good dump on disk
  CachingAllocator allocator(test_support::simulated());
  HistoryRecorder recorder(allocator);
  workload(allocator, 3000);
  const fs::path path = scratch() / "full_disk.snap";
  REQUIRE(recorder.dump_snapshot(path));
  const snapshot::Snapshot before = snapshot::read_snapshot(path);
  workload(allocator, 3000);
  // When the disk is full: files may grow to 4 KiB only (SIGXFSZ ignored,
  // so write() fails with EFBIG as on a full disk with ENOSPC)
  struct rlimit saved {};
  ::getrlimit(RLIMIT_FSIZE, &saved);
  auto* previous = ::signal(SIGXFSZ, SIG_IGN);
  bool written = true;
  const std::string err = stderr_of([&] {
    struct rlimit small = saved;
    small.rlim_cur = 4096;
    ::setrlimit(RLIMIT_FSIZE, &small);
    written = recorder.dump_snapshot(path);
    ::setrlimit(RLIMIT_FSIZE, &saved);
  });
  ::signal(SIGXFSZ, previous);
  // Then the dump fails with one line naming the path and the reason, recording stops,
  CHECK_FALSE(written);
  CHECK(lines(err) == 1);
  CHECK(err.find("cannot dump the memory snapshot to " + path.string()) != std::string::npos);
  CHECK(err.find("File too large") != std::string::npos);
  CHECK(err.find("deactivating history recording") != std::string::npos);
  CHECK_FALSE(recorder.recording());
  // the previous snapshot is still there, whole, and no temporary file is left
  CHECK(snapshot::read_snapshot(path) == before);
  CHECK(std::none_of(fs::directory_iterator(scratch()), fs::directory_iterator(),
                     [](const fs::directory_entry& e) { return e.path().string().find(".tmp.") != std::string::npos; }));
  // and the allocator goes on serving
  check_allocator_serves(allocator);
}

TEST_CASE("a dump to an unwritable path fails with one line, stops recording, and the allocator goes on") {
  for (const fs::path& path : {fs::path("/nonexistent-directory/for/sure/x.snap"),
                               scratch() / "a_file" / "under_a_file.snap", fs::path("/proc/version/x.snap")}) {
    CAPTURE(path);
    std::ofstream(scratch() / "a_file") << "not a directory";
    // Given a recording allocator
    CachingAllocator allocator(test_support::simulated());
    HistoryRecorder recorder(allocator);
    workload(allocator, 500);
    // When the dump cannot create its file
    bool written = true;
    const std::string err = stderr_of([&] { written = recorder.dump_snapshot(path); });
    // Then one line, recording off, the allocator serving
    CHECK_FALSE(written);
    CHECK(lines(err) == 1);
    CHECK(err.starts_with("cachealloc: cannot dump the memory snapshot to " + path.string() + ": "));
    CHECK_FALSE(recorder.recording());
    check_allocator_serves(allocator);
  }
}

TEST_CASE("a symbolizer that fails stops recording with one line; the dump is written with bare addresses") {
  // Given a recorder capturing stacks, and a symbolizer that throws
  CachingAllocator allocator(test_support::simulated());
  HistoryOptions options;
  options.stacks = StackCapture::native;
  HistoryRecorder recorder(allocator, options);
  workload(allocator, 200);
  const auto previous =
      detail::replace_symbolizer([](std::uintptr_t) -> detail::SymbolizedFrame { throw std::runtime_error("no debug info"); });
  const fs::path path = scratch() / "symbolizer.snap";
  bool written = true;
  // When the snapshot is dumped
  const std::string err = stderr_of([&] { written = recorder.dump_snapshot(path); });
  detail::replace_symbolizer(previous);
  // Then one line says so and recording stops
  CHECK_FALSE(written);
  CHECK(lines(err) == 1);
  CHECK(err.find("the symbolizer failed on") != std::string::npos);
  CHECK(err.find("deactivating history recording") != std::string::npos);
  CHECK_FALSE(recorder.recording());
  // and the file holds the trace, its frames unnamed but with their addresses
  const snapshot::Snapshot s = snapshot::read_snapshot(path);
  CHECK(s.frames.size() > 1);
  CHECK(std::all_of(s.frames.begin() + 1, s.frames.end(), [](const snapshot::Frame& f) { return f.ip != 0 && !f.function; }));
  CHECK(s.events.size() > 200);
  check_allocator_serves(allocator);
}

TEST_CASE("a ring chunk that cannot be allocated stops recording with one line; the allocator goes on serving") {
  // Given a recording allocator whose thread already has its buffer
  CachingAllocator allocator(test_support::simulated());
  HistoryRecorder recorder(allocator);
  allocator.deallocate(allocator.allocate(4096));
  const std::uint64_t recorded = recorder.recorded_events();
  // When the ring's next chunk cannot be allocated (the buffer fills after 256 events)
  const std::string err = stderr_of([&] {
    g_fail_ring_allocations = true;
    workload(allocator, 400);
    g_fail_ring_allocations = false;
  });
  // Then one line, recording off, and the allocator served every call
  CHECK(lines(err) == 1);
  CHECK(err == "cachealloc: cannot allocate a chunk of the event ring (out of memory); deactivating history recording\n");
  CHECK_FALSE(recorder.recording());
  CHECK(recorded > 0);
  check_allocator_serves(allocator);
  // and a dump still works, with what was recorded before
  const fs::path path = scratch() / "ring.snap";
  CHECK(recorder.dump_snapshot(path));
  snapshot::validate(snapshot::read_snapshot(path));
  // and a restart records again
  recorder.start(HistoryOptions{});
  workload(allocator, 100);
  CHECK(recorder.recording());
}

TEST_CASE("a thread whose event buffer cannot be allocated stops recording with one line") {
  CachingAllocator allocator(test_support::simulated());
  HistoryRecorder recorder(allocator);
  const std::string err = stderr_of([&] {
    std::thread([&] {
      g_fail_ring_allocations = true;
      allocator.deallocate(allocator.allocate(4096));
      g_fail_ring_allocations = false;
    }).join();
  });
  CHECK(err == "cachealloc: cannot allocate a thread's event buffer (out of memory); deactivating history recording\n");
  CHECK_FALSE(recorder.recording());
  check_allocator_serves(allocator);
}

TEST_CASE("SIGKILL in the middle of repeated dumps leaves the previous complete snapshot or the new one") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const int kRuns = 40;
#else
  const int kRuns = 200;
#endif
  const fs::path path = scratch() / "killed.snap";
  std::mt19937 random(18);
  int found = 0, analyzed = 0, during_first = 0;
  for (int run = 0; run < kRuns; ++run) {
    // Given a process that records and dumps to the same path over and over,
    // and tells us when its first dump is complete
    fs::remove(path);
    int first_dump[2];
    REQUIRE(::pipe(first_dump) == 0);
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(first_dump[0]);
      CachingAllocator allocator(test_support::simulated());
      HistoryRecorder recorder(allocator);
      for (int i = 0;; ++i) {
        workload(allocator, 50 + i % 200);
        if (!recorder.dump_snapshot(path)) ::_exit(3);
        if (i == 0) {
          const char done = 1;
          if (::write(first_dump[1], &done, 1) != 1) ::_exit(4);
          ::close(first_dump[1]);
        }
      }
    }
    ::close(first_dump[1]);
    // When it is killed at a random moment: in one run of four while its
    // first dump may still be under way (a fixed 2-32 ms after the start),
    // else 0-30 ms after the first dump completed, whatever the build's speed
    // (a sanitizer's child may take longer than that to dump once)
    const bool early = run % 4 == 0;
    bool dumped = false;
    if (!early) {
      pollfd wait{first_dump[0], POLLIN, 0};
      char done = 0;
      dumped = ::poll(&wait, 1, 120'000) == 1 && ::read(first_dump[0], &done, 1) == 1;
    }
    std::this_thread::sleep_for(std::chrono::microseconds((early ? 2000 : 0) + random() % 30000));
    ::kill(child, SIGKILL);
    ::close(first_dump[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    CAPTURE(run);
    if (!early) CHECK(dumped);  // the child did dump once
    // Then the file is absent (killed before the first rename) or a whole snapshot that analyzes
    if (!fs::exists(path)) {
      CHECK(early);  // once a dump completed, the path always holds a whole snapshot
      continue;
    }
    ++found;
    if (early) ++during_first;
    const snapshot::Snapshot s = snapshot::read_snapshot(path);  // throws on a torn file
    snapshot::validate(s);
    const analyzer::Document summary = analyzer::summary_report(s, analyzer::ReportOptions{});
    std::ostringstream out;
    analyzer::render(summary, analyzer::Format::json, out);
    CHECK(!out.str().empty());
    ++analyzed;
    for (const auto& entry : fs::directory_iterator(scratch()))
      if (entry.path().string().find("killed.snap.tmp.") != std::string::npos) fs::remove(entry.path());
  }
  MESSAGE(kRuns << " kills, " << found << " found a file (" << during_first << " of them from the runs killed early), "
                << analyzed << " analyzed cleanly");
  CHECK(found == analyzed);
  CHECK(found >= kRuns * 3 / 4);  // every run killed after its first dump found a whole file
}

TEST_CASE("OOMs from 8 threads at once are all in the dump on OOM") {
  // Given a capped device, a recorder that dumps on OOM, and 8 threads ready
  CachingAllocator allocator(test_support::simulated(256 * MiB));
  HistoryOptions options;
  options.dump_on_oom = scratch() / "many_ooms.snap";
  HistoryRecorder recorder(allocator, options);
  void* held = allocator.allocate(200 * MiB);
  constexpr int kThreads = 8;
  std::barrier start(kThreads);
  std::atomic<int> ooms{0};
  // When all of them run out of memory at the same moment
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      try {
        allocator.deallocate(allocator.allocate(100 * MiB));
      } catch (const OutOfMemoryError&) {
        ooms.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  recorder.flush();
  // Then the dump holds every one of their OOM events, from 8 threads
  REQUIRE(ooms.load() == kThreads);
  const snapshot::Snapshot s = snapshot::read_snapshot(options.dump_on_oom);
  std::vector<std::uint32_t> oom_threads;
  for (const auto& e : s.events)
    if (e.kind == snapshot::EventKind::oom) oom_threads.push_back(e.thread);
  CHECK(oom_threads.size() == kThreads);
  std::sort(oom_threads.begin(), oom_threads.end());
  CHECK(std::unique(oom_threads.begin(), oom_threads.end()) - oom_threads.begin() == kThreads);
  CHECK(recorder.recording());
  allocator.deallocate(held);
  check_allocator_serves(allocator);
}
