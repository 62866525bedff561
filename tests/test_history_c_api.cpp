// The C ABI's streamed recording (cachealloc_record_history_stream) and
// CACHEALLOC_HISTORY's syntax. CACHEALLOC_HISTORY acting on a whole process
// is in test_history_environment.cpp: it needs a process whose allocator
// is not made yet.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "cachealloc/cachealloc.h"
#include "cachealloc/errors.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/stream.hpp"

using namespace cachealloc;
using snapshot::EventKind;

namespace {

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::path(CACHEALLOC_BINARY_DIR) / ("test_history_c_api_" + name);
}

std::size_t count_kind(const snapshot::Snapshot& s, EventKind kind) {
  return static_cast<std::size_t>(
      std::count_if(s.events.begin(), s.events.end(), [&](const snapshot::Event& e) { return e.kind == kind; }));
}

// The message of the ConfigError that parse_history_setting throws for `text`.
std::string setting_error(const std::string& text) {
  try {
    (void)parse_history_setting(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("the C ABI streams the process-wide allocator's events to a file, trailer included") {
  // Given the process-wide allocator on the simulated device, streamed
  setenv("CACHEALLOC_DEVICE", "simulated", 1);
  const auto pattern = temp_path("run.{pid}.bin");
  const auto path = temp_path("run." + std::to_string(getpid()) + ".bin");
  std::filesystem::remove(path);
  cachealloc_history_options options;
  cachealloc_history_options_init(&options);
  options.stacks = CACHEALLOC_STACKS_NONE;
  cachealloc_stream_options stream;
  cachealloc_stream_options_init(&stream);
  CHECK(stream.size == sizeof(cachealloc_stream_options));
  CHECK(stream.buffer_bytes == (64u << 20));
  stream.path = pattern.c_str();
  REQUIRE(cachealloc_record_history_stream(&options, &stream) == CACHEALLOC_OK);
  // When it allocates and frees 300 blocks and stops
  for (int i = 0; i < 300; ++i) {
    void* p = cachealloc_malloc(static_cast<std::size_t>(1 + i % 7) << 20, 0);
    REQUIRE(p != nullptr);
    cachealloc_free(p, 0, 0);
  }
  cachealloc_stop_history();
  // Then the file ({pid} expanded) is a finished version 7 stream of every event
  const snapshot::Snapshot s = snapshot::read_snapshot(path);
  CHECK(s.header.format_version == snapshot::kStreamFormatVersion);
  CHECK(s.settings.count(snapshot::kStreamNoteSetting) == 0);
  CHECK(count_kind(s, EventKind::alloc) == 300);
  CHECK(count_kind(s, EventKind::free_completed) == 300);
  CHECK(!s.stats.empty());
  std::uint64_t written = 0, dropped = 1;
  cachealloc_stream_progress(&written, &dropped);
  CHECK(written == s.events.size());
  CHECK(dropped == 0);
  std::filesystem::remove(path);
}

TEST_CASE("a stream the C ABI cannot create is an I/O error, and a malformed stream struct is refused") {
  setenv("CACHEALLOC_DEVICE", "simulated", 1);
  cachealloc_history_options options;
  cachealloc_history_options_init(&options);
  cachealloc_stream_options stream;
  cachealloc_stream_options_init(&stream);
  stream.path = "/nonexistent-directory/run.bin";
  CHECK(cachealloc_record_history_stream(&options, &stream) == CACHEALLOC_IO_ERROR);
  CHECK(std::string(cachealloc_last_error()).find("/nonexistent-directory/run.bin") != std::string::npos);
  // A struct the caller did not initialize (size 0) is not read further
  stream.size = 0;
  CHECK(cachealloc_record_history_stream(&options, &stream) == CACHEALLOC_INVALID_ARGUMENT);
  CHECK(std::string(cachealloc_last_error()).find("cachealloc_stream_options_init") != std::string::npos);
  cachealloc_stream_options_init(&stream);
  const std::string x_path = temp_path("x.bin").string();  // outlives the calls that read stream.path
  stream.path = x_path.c_str();
  stream.when_full = 7;
  CHECK(cachealloc_record_history_stream(&options, &stream) == CACHEALLOC_INVALID_ARGUMENT);
  stream.when_full = CACHEALLOC_STREAM_DROP;
  stream.buffer_bytes = 1 << 20;
  CHECK(cachealloc_record_history_stream(&options, &stream) == CACHEALLOC_INVALID_ARGUMENT);
  CHECK(std::string(cachealloc_last_error()).find("16 MiB") != std::string::npos);
  // A NULL stream is a plain recording
  CHECK(cachealloc_record_history_stream(&options, nullptr) == CACHEALLOC_OK);
  cachealloc_stop_history();
}

TEST_CASE("CACHEALLOC_HISTORY's pairs set the streamed recording's options") {
  const HistoryOptions o = parse_history_setting(
      " stream:/tmp/a:b/run.{pid}.bin , stacks:none,max_frames:8,stacks_on_free:true,clock:coarse,"
      "when_full:drop,buffer_mb:32");
  CHECK(o.stream == "/tmp/a:b/run.{pid}.bin");
  CHECK(o.stacks == StackCapture::none);
  CHECK(o.max_frames == 8);
  CHECK(o.stacks_on_free);
  CHECK(o.clock == HistoryClock::coarse);
  CHECK(o.stream_when_full == StreamWhenFull::drop);
  CHECK(o.stream_buffer_bytes == (32u << 20));
  // The defaults where a key is left out
  const HistoryOptions plain = parse_history_setting("stream:run.bin");
  CHECK(plain.stacks == HistoryOptions{}.stacks);
  CHECK(plain.stream_when_full == StreamWhenFull::wait);
  CHECK(plain.stream_buffer_bytes == HistoryOptions{}.stream_buffer_bytes);
}

TEST_CASE("a bad CACHEALLOC_HISTORY is one line naming the variable and the pair") {
  CHECK(setting_error("") == "CACHEALLOC_HISTORY: no stream:PATH (e.g. CACHEALLOC_HISTORY=stream:/tmp/run.{pid}.bin)");
  CHECK(setting_error("stacks:none") ==
        "CACHEALLOC_HISTORY: no stream:PATH (e.g. CACHEALLOC_HISTORY=stream:/tmp/run.{pid}.bin)");
  CHECK(setting_error("/tmp/run.bin") ==
        "CACHEALLOC_HISTORY: '/tmp/run.bin': expected key:value (e.g. stream:/tmp/run.bin)");
  CHECK(setting_error("stream:") == "CACHEALLOC_HISTORY: 'stream:': the stream needs a path");
  CHECK(setting_error("stream:a,stacks:all") ==
        "CACHEALLOC_HISTORY: 'stacks:all': unknown stack capture 'all' (expected none, native, unwind, python, "
        "native+python or unwind+python)");
  CHECK(setting_error("stream:a,when_full:block") ==
        "CACHEALLOC_HISTORY: 'when_full:block': unknown stream_when_full 'block' (expected wait or drop)");
  CHECK(setting_error("stream:a,buffer_mb:8") == "CACHEALLOC_HISTORY: 'buffer_mb:8': must be within [16, 1048576]");
  CHECK(setting_error("stream:a,max_frames:-1") ==
        "CACHEALLOC_HISTORY: 'max_frames:-1': expected a non-negative integer");
  CHECK(setting_error("stream:a,max_frames:0") == "CACHEALLOC_HISTORY: 'max_frames:0': must be within [1, 256]");
  CHECK(setting_error("stream:a,stacks_on_free:yes") ==
        "CACHEALLOC_HISTORY: 'stacks_on_free:yes': expected true or false");
  CHECK(setting_error("stream:a,ring:10") ==
        "CACHEALLOC_HISTORY: 'ring:10': unknown key (known: stream, stacks, max_frames, stacks_on_free, clock, "
        "when_full, buffer_mb)");
}

TEST_CASE("{pid} and {device} in a stream's path become the process id and the device") {
  CHECK(expand_stream_path("/tmp/run.{pid}.{device}.bin", 4242, 3) == "/tmp/run.4242.3.bin");
  CHECK(expand_stream_path("{pid}{pid}", 7, 0) == "77");
  CHECK(expand_stream_path("/tmp/{other}.bin", 7, 0) == "/tmp/{other}.bin");
}
