// Every sequence recorded from PyTorch's allocator in testdata/conformance
// replays with every figure matching on every row; and the checker itself
// reports a planted difference exactly.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cachealloc/conformance.hpp"

namespace fs = std::filesystem;
namespace conf = cachealloc::conformance;

namespace {

const fs::path kDir = fs::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "conformance";

conf::Result replay_file(const fs::path& csv) {
  conf::ReplayOptions options;
  if (fs::exists(conf::address_trace_path(csv))) options.address_script = conf::read_address_trace(conf::address_trace_path(csv));
  return conf::replay(conf::read_sequence(csv), options);
}

std::vector<fs::path> sequences() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(kDir))
    if (entry.path().extension() == ".csv") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST_CASE("every sequence in testdata/conformance matches PyTorch on every row") {
  const auto files = sequences();
  REQUIRE(files.size() >= 6);
  for (const auto& csv : files) {
    CAPTURE(csv.filename().string());
    const conf::Result result = replay_file(csv);
    if (!result.ok) {
      const auto& m = result.first_mismatch;
      std::ostringstream detail;
      detail << "row " << m.row << " (" << m.op << " " << m.bytes << ") " << m.note;
      for (const auto& figure : m.figures) detail << " " << figure;
      FAIL_CHECK(detail.str());
    }
    CHECK(result.matched == result.rows);
    CHECK(result.rows > 1000);
  }
}

TEST_CASE("a figure altered in one row is reported at exactly that row and figure") {
  const fs::path original = kDir / "seq101_default.csv";
  auto sequence = conf::read_sequence(original);
  // Given a copy with row 1234's reserved figure off by 512 bytes...
  const std::size_t row = 1234;
  const std::size_t reserved_index = 1;
  REQUIRE(std::string(conf::kFigures[reserved_index]) == "reserved");
  sequence.rows[row - 1].figures[reserved_index] += 512;
  // ...when it is replayed, then the first mismatch is that row and only that figure.
  conf::ReplayOptions options;
  if (fs::exists(conf::address_trace_path(original)))
    options.address_script = conf::read_address_trace(conf::address_trace_path(original));
  const conf::Result result = conf::replay(sequence, options);
  CHECK_FALSE(result.ok);
  CHECK(result.matched == row - 1);
  CHECK(result.first_mismatch.row == row);
  CHECK(result.first_mismatch.line == row + 1);
  REQUIRE(result.first_mismatch.figures.size() == 1);
  CHECK(result.first_mismatch.figures[0] == "reserved");
  CHECK(result.first_mismatch.expected[reserved_index] == result.first_mismatch.actual[reserved_index] + 512);
}

TEST_CASE("the conformance tool prints the altered row and figure and exits 1") {
  const fs::path tool = fs::path(CACHEALLOC_BINARY_DIR) / "bin" / "cachealloc-conformance";
  REQUIRE(fs::exists(tool));
  const fs::path dir = fs::temp_directory_path() / "cachealloc-conformance-test";
  fs::create_directories(dir);
  const fs::path altered = dir / "altered.csv";
  {
    std::ifstream in(kDir / "seq101_default.csv");
    std::ofstream out(altered);
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      if (number == 101) {  // row 100: change the 'segments' column (index 8) by one
        std::vector<std::string> fields;
        std::stringstream ss(line);
        for (std::string field; std::getline(ss, field, ',');) fields.push_back(field);
        fields[8] = std::to_string(std::stoll(fields[8]) + 1);
        line.clear();
        for (std::size_t i = 0; i < fields.size(); ++i) line += (i ? "," : "") + fields[i];
      }
      out << line << "\n";
    }
  }
  const fs::path output = dir / "out.txt";
  const std::string command = tool.string() + " " + altered.string() + " > " + output.string() + " 2>&1";
  const int status = std::system(command.c_str());
  CHECK(WEXITSTATUS(status) == 1);
  std::ifstream in(output);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("99/4000 rows match; first mismatch at row 100 (line 101)") != std::string::npos);
  CHECK(text.find("* segments") != std::string::npos);
  CHECK(text.find("* reserved") == std::string::npos);
}

TEST_CASE("the conformance tool rejects a missing or malformed file with exit code 2") {
  const fs::path tool = fs::path(CACHEALLOC_BINARY_DIR) / "bin" / "cachealloc-conformance";
  const fs::path dir = fs::temp_directory_path() / "cachealloc-conformance-test";
  fs::create_directories(dir);
  std::ofstream(dir / "bad.csv") << "op,id\nalloc,1\n";
  for (const std::string& arg : {(dir / "missing.csv").string(), (dir / "bad.csv").string(), dir.string(), std::string("--bogus")}) {
    CAPTURE(arg);
    const int status = std::system((tool.string() + " " + arg + " > /dev/null 2>&1").c_str());
    CHECK(WEXITSTATUS(status) == 2);
  }
}
