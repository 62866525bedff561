// cachealloc-analyze end to end: exit codes, the default subcommand, -o and
// export. Runs the built executable; skipped when it has not been built.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../analyzer/testing/trace_builder.hpp"
#include "cachealloc/snapshot/format.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path kTool = fs::path(CACHEALLOC_BINARY_DIR) / "bin" / "cachealloc-analyze";
const fs::path kSample = fs::path(CACHEALLOC_SOURCE_DIR) / "analyzer" / "testdata" / "small_step.bin";

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

Result run(const std::string& arguments) {
  const fs::path dir = fs::temp_directory_path() / ("cachealloc-cli-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string command =
      kTool.string() + " " + arguments + " >" + (dir / "out").string() + " 2>" + (dir / "err").string();
  const int status = std::system(command.c_str());
  auto slurp = [](const fs::path& path) {
    std::ifstream in(path);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  };
  Result result{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir / "out"), slurp(dir / "err")};
  fs::remove_all(dir);
  return result;
}

bool tool_built() {
  if (fs::exists(kTool)) return true;
  MESSAGE("cachealloc-analyze is not built; skipping");
  return false;
}

std::size_t lines(const std::string& text) { return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')); }

}  // namespace

TEST_CASE("a file without a subcommand prints the summary and exits 0") {
  if (!tool_built()) return;
  const Result plain = run(kSample.string());
  const Result summary = run("summary " + kSample.string());
  CHECK(plain.code == 0);
  CHECK(plain.out == summary.out);
  CHECK(plain.out.find("peaks") != std::string::npos);
}

TEST_CASE("bad usage exits 2 with one line on stderr") {
  if (!tool_built()) return;
  for (const std::string& arguments : std::vector<std::string>
       {std::string(""), std::string("peak"), "segments " + kSample.string() + " --format xml",
        "events " + kSample.string() + " --kind nonsense", "summary " + kSample.string() + " --from soon",
        "export " + kSample.string()}) {
    CAPTURE(arguments);
    const Result result = run(arguments);
    CHECK(result.code == 2);
    CHECK(lines(result.err) == 1);
  }
}

TEST_CASE("an unreadable input exits 2 with one line on stderr") {
  if (!tool_built()) return;
  const fs::path junk = fs::temp_directory_path() / "cachealloc-cli-junk.bin";
  std::ofstream(junk) << "not a snapshot";
  for (const std::string& path : {std::string("/nonexistent/run.bin"), junk.string()}) {
    const Result result = run(path);
    CHECK(result.code == 2);
    CHECK(lines(result.err) == 1);
  }
  fs::remove(junk);
}

TEST_CASE("a version 4 file whose head is cut short exits 2 with one line on stderr") {
  if (!tool_built()) return;
  // Given a recording whose ring overflowed, written as version 4 (the ring
  // start at the head's end), then cut inside its head, the sizes fixed up
  cachealloc::snapshot::Snapshot trace = cachealloc::analyzer::testing::random_trace(2, 2000);
  trace.events.erase(trace.events.begin(), trace.events.begin() + 100);
  trace.dropped_events = 100;
  const fs::path path = fs::temp_directory_path() / ("cachealloc-cli-short-head-" + std::to_string(::getpid()) + ".bin");
  cachealloc::snapshot::write_snapshot(trace, path);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  std::uint64_t head_size = 0;
  for (std::size_t i = 0; i < 8; ++i) head_size |= std::uint64_t{static_cast<unsigned char>(bytes[24 + i])} << (8 * i);
  const std::uint64_t keep = head_size - 3;
  bytes.resize(32 + keep);
  for (std::size_t i = 0; i < 8; ++i) {
    bytes[16 + i] = static_cast<char>(((8 + keep) >> (8 * i)) & 0xff);
    bytes[24 + i] = static_cast<char>((keep >> (8 * i)) & 0xff);
  }
  std::ofstream(path, std::ios::binary) << bytes;
  // When any report reads it, then it exits 2 with one line on stderr
  for (const char* subcommand : {"summary", "peak", "segments"}) {
    CAPTURE(subcommand);
    const Result result = run(std::string(subcommand) + " " + path.string());
    CHECK(result.code == 2);
    CHECK(lines(result.err) == 1);
    CHECK(result.err.find("snapshot") != std::string::npos);
  }
  fs::remove(path);
}

TEST_CASE("--help shows examples and --version the version, both exit 0") {
  if (!tool_built()) return;
  const Result help = run("peak --help");
  CHECK(help.code == 0);
  CHECK(help.out.find("Examples") != std::string::npos);
  const Result version = run("top --version");
  CHECK(version.code == 0);
  CHECK(version.out.find("cachealloc-analyze") != std::string::npos);
}

TEST_CASE("export writes CSV with a header row to -o") {
  if (!tool_built()) return;
  const fs::path out = fs::temp_directory_path() / "cachealloc-cli-export.csv";
  const Result result = run("export " + kSample.string() + " --what timeline -o " + out.string());
  CHECK(result.code == 0);
  std::ifstream in(out);
  std::string header;
  std::getline(in, header);
  CHECK(header.rfind("first_event,event,time_ns,kind,allocated,reserved,active,requested,peak", 0) == 0);
  fs::remove(out);
}
