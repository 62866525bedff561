// Reading an input: "-" is standard input, gzip and zstd are read by content,
// the header is checked before anything else is read, and a pickle of the
// segments alone (pickle.dump(torch.cuda.memory_snapshot())) is accepted.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/input.hpp"
#include "cachealloc/snapshot/load.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "cachealloc/snapshot/reader.hpp"
#include "cachealloc/snapshot/stream.hpp"

namespace fs = std::filesystem;
using namespace cachealloc::snapshot;

namespace {

const fs::path kSource = CACHEALLOC_SOURCE_DIR;
const fs::path kOurs = kSource / "analyzer" / "testdata" / "small_step.bin";
const fs::path kPickle = kSource / "testdata" / "pytorch" / "gru_python_stacks.pickle";

fs::path temp(const std::string& name) {
  return fs::temp_directory_path() / ("cachealloc-input-" + std::to_string(::getpid()) + "-" + name);
}

bool have(const char* tool) { return std::system((std::string("command -v ") + tool + " >/dev/null 2>&1").c_str()) == 0; }

long peak_rss_kib() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

ErrorCode refusal(const fs::path& path, std::string& message) {
  try {
    (void)load(path);
  } catch (const SnapshotError& error) {
    message = error.what();
    return error.code();
  }
  return ErrorCode::io;  // not refused: no code of its own
}

}  // namespace

TEST_CASE("given a snapshot compressed with gzip or zstd, when it is loaded, then it equals the plain file") {
  const Snapshot plain = load(kOurs);
  const Snapshot pickle = load(kPickle);
  for (const char* tool : {"gzip", "zstd"}) {
    CAPTURE(tool);
    if (!have(tool)) {
      MESSAGE(tool << " is not installed; skipping");
      continue;
    }
    for (const fs::path& input : {kOurs, kPickle}) {
      const fs::path packed = temp(input.filename().string() + "." + tool);
      REQUIRE(std::system((std::string(tool) + " -c -q " + input.string() + " > " + packed.string()).c_str()) == 0);
      const InputBytes bytes(packed);
      CHECK(bytes.compression() == (std::string(tool) == "gzip" ? Compression::gzip : Compression::zstd));
      CHECK(load(packed) == (input == kOurs ? plain : pickle));
      fs::remove(packed);
    }
  }
}

TEST_CASE("given two gzip members one after the other, when they are read, then they are one input as gzip -d reads them") {
  if (!have("gzip")) return;
  std::ifstream in(kOurs, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const fs::path first = temp("first"), second = temp("second"), both = temp("both.gz");
  std::ofstream(first, std::ios::binary) << bytes.substr(0, 100);
  std::ofstream(second, std::ios::binary) << bytes.substr(100);
  REQUIRE(std::system(("gzip -c " + first.string() + " > " + both.string() + " && gzip -c " + second.string() +
                       " >> " + both.string()).c_str()) == 0);
  CHECK(load(both) == load(kOurs));
  fs::remove(first), fs::remove(second), fs::remove(both);
}

TEST_CASE("given '-', when it is loaded, then standard input is read") {
  const int saved = ::dup(STDIN_FILENO);
  const int file = ::open(kOurs.c_str(), O_RDONLY);
  REQUIRE(file >= 0);
  ::dup2(file, STDIN_FILENO);
  ::close(file);
  const Snapshot from_stdin = load("-");
  ::dup2(saved, STDIN_FILENO);
  ::close(saved);
  CHECK(from_stdin == load(kOurs));
}

namespace {

const fs::path kStreamed = kSource / "testdata" / "format_versions" / "v7.bin";

// What the streaming reader reads from a file: its head and every block.
Snapshot read_with_reader(const fs::path& path) {
  SnapshotReader reader(path);
  Snapshot s = reader.head();
  std::vector<Event> block;
  while (reader.next_block(block)) s.events.insert(s.events.end(), block.begin(), block.end());
  return s;
}

Snapshot load_from_standard_input(const fs::path& path) {
  const int saved = ::dup(STDIN_FILENO);
  const int file = ::open(path.c_str(), O_RDONLY);
  REQUIRE(file >= 0);
  ::dup2(file, STDIN_FILENO);
  ::close(file);
  struct Restore {
    int saved;
    ~Restore() {
      ::dup2(saved, STDIN_FILENO);
      ::close(saved);
    }
  } restore{saved};
  return load("-");
}

}  // namespace

TEST_CASE("given a streamed recording, whole or killed, on standard input or compressed, when it is loaded, "
          "then it equals the file as the streaming reader reads it") {
  // Given the version 7 golden stream, and the same stream cut inside its
  // trailer (a recording killed before it finished)
  std::ifstream in(kStreamed, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() > 100);
  const fs::path killed = temp("killed-v7.bin");
  std::ofstream(killed, std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  for (const fs::path& file : {kStreamed, killed}) {
    CAPTURE(file);
    const Snapshot expected = read_with_reader(file);
    REQUIRE(expected.header.format_version == kStreamFormatVersion);
    REQUIRE(!expected.events.empty());
    CHECK(expected.settings.count(kStreamNoteSetting) == (file == killed ? 1u : 0u));
    // When it is loaded from the file, from standard input and compressed
    // Then each is the same snapshot, the killed one with the same note
    CHECK(load(file) == expected);
    CHECK(load_from_standard_input(file) == expected);
    for (const char* tool : {"gzip", "zstd"}) {
      CAPTURE(tool);
      if (!have(tool)) continue;
      const fs::path packed = temp(file.filename().string() + "." + tool);
      REQUIRE(std::system((std::string(tool) + " -c -q " + file.string() + " > " + packed.string()).c_str()) == 0);
      CHECK(load(packed) == expected);
      fs::remove(packed);
    }
  }
  fs::remove(killed);
}

TEST_CASE("given endless or large inputs that are not snapshots, when they are loaded, then each is refused at once") {
  // A sparse 1 GB file of zeros costs no disk.
  const fs::path zeros = temp("zeros");
  {
    const int fd = ::open(zeros.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, off_t{1} << 30) == 0);
    ::close(fd);
  }
  for (const fs::path& path : {fs::path("/dev/zero"), fs::path("/dev/urandom"), zeros}) {
    CAPTURE(path);
    const long rss_before = peak_rss_kib();
    const auto start = std::chrono::steady_clock::now();
    std::string message;
    CHECK(refusal(path, message) == ErrorCode::not_a_snapshot);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(seconds < 1.0);
    CHECK(peak_rss_kib() - rss_before < 50 * 1024);
    CHECK(message.starts_with("not a cachealloc snapshot or PyTorch memory snapshot (it starts with "));
  }
  std::string message;
  refusal(zeros, message);
  CHECK(message == "not a cachealloc snapshot or PyTorch memory snapshot (it starts with 00 00 00 00)");
  fs::remove(zeros);
}

TEST_CASE("given compressed zeros, when they are loaded, then they are refused on the first decompressed bytes") {
  if (!have("gzip") || !have("zstd")) return;
  for (const char* tool : {"gzip", "zstd"}) {
    CAPTURE(tool);
    const fs::path packed = temp(std::string("zeros.") + tool);
    // 256 MB of zeros packs into a few hundred KB; unpacked whole it would be 256 MB.
    REQUIRE(std::system(("head -c 268435456 /dev/zero | " + std::string(tool) + " -c -q > " + packed.string()).c_str()) == 0);
    const long rss_before = peak_rss_kib();
    std::string message;
    CHECK(refusal(packed, message) == ErrorCode::not_a_snapshot);
    CHECK(peak_rss_kib() - rss_before < 50 * 1024);
    CHECK(message == "not a cachealloc snapshot or PyTorch memory snapshot (its content starts with 00 00 00 00; " +
                         std::string(tool) + "-compressed)");
    fs::remove(packed);
  }
}

TEST_CASE("given a gzip file cut short, when it is loaded, then it is refused as truncated") {
  if (!have("gzip")) return;
  const fs::path packed = temp("cut.gz");
  REQUIRE(std::system(("gzip -c " + kOurs.string() + " | head -c 300 > " + packed.string()).c_str()) == 0);
  std::string message;
  CHECK(refusal(packed, message) == ErrorCode::truncated);
  CHECK(message == "truncated snapshot: the gzip data ends early");
  fs::remove(packed);
}

TEST_CASE("given a pickle of torch.cuda.memory_snapshot() (a list of segments), when it is loaded, "
          "then its layout matches PyTorch's memory_stats and it says it has no trace") {
  // segments_only/gru_python_stacks.pickle is pickle.dump(snapshot["segments"]) of
  // gru_python_stacks.pickle; PyTorch's figures at that dump are in its stats.json.
  const Snapshot snapshot = load(kSource / "testdata" / "pytorch" / "segments_only" / "gru_python_stacks.pickle");
  CHECK(snapshot.settings.at(kSegmentsOnlySetting) == "true");
  CHECK(snapshot.events.empty());
  std::uint64_t reserved = 0, allocated = 0;
  for (const Segment& segment : snapshot.segments) {
    reserved += segment.total_size;
    for (const Block& block : segment.blocks) {
      if (block.state == BlockState::active_allocated) allocated += block.size;
    }
  }
  CHECK(snapshot.segments.size() == 4);        // segment.all.current
  CHECK(reserved == 58720256);                 // reserved_bytes.all.current
  CHECK(allocated == 34062336);                // allocated_bytes.all.current
  CHECK(snapshot.segments == load(kPickle).segments);
}
