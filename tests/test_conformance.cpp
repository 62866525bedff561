// Every sequence recorded from PyTorch's allocator in testdata/conformance
// replays with every figure matching on every row, on the simulated device's
// driver address model alone; the model returns the addresses the H200's
// driver returned; and the checker itself reports a planted difference
// exactly.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "conformance/harness.hpp"

namespace fs = std::filesystem;
namespace conf = cachealloc::conformance;

namespace {

const fs::path kDir = fs::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "conformance";

// No address trace: the simulated device's own driver address model.
conf::Result replay_file(const fs::path& csv, std::vector<std::uintptr_t>* addresses = nullptr) {
  return conf::replay(conf::read_sequence(csv), {}, addresses);
}

// Addresses relative to the base B of their own process: a fresh process's
// first cudaMalloc lands at B + 30 MiB.
std::vector<std::int64_t> relative_to_base(const std::vector<std::uintptr_t>& addresses) {
  std::vector<std::int64_t> offsets;
  if (addresses.empty()) return offsets;
  const std::int64_t base = static_cast<std::int64_t>(addresses.front()) - (std::int64_t{30} << 20);
  for (std::uintptr_t a : addresses) offsets.push_back(static_cast<std::int64_t>(a) - base);
  return offsets;
}

std::vector<fs::path> sequences() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(kDir))
    if (entry.path().extension() == ".csv") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST_CASE("every sequence in testdata/conformance matches PyTorch on every row with no address trace") {
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

TEST_CASE("the simulated device returns every address the H200's driver returned to PyTorch, relative to its base") {
  std::size_t traces = 0, compared = 0;
  for (const auto& csv : sequences()) {
    const fs::path trace = conf::address_trace_path(csv);
    if (!fs::exists(trace)) continue;
    const auto real = conf::read_address_trace(trace);
    if (real.empty()) continue;  // expandable segments: no cudaMalloc at all
    CAPTURE(csv.filename().string());
    ++traces;
    // Given PyTorch's cudaMalloc addresses on the H200, in order, when the
    // sequence replays on the simulated device, then each address it got
    // sits at the same offset from its process's base.
    std::vector<std::uintptr_t> simulated;
    REQUIRE(replay_file(csv, &simulated).ok);
    REQUIRE(simulated.size() == real.size());
    const auto expected = relative_to_base(real), actual = relative_to_base(simulated);
    std::size_t first_difference = expected.size();
    for (std::size_t i = 0; i < expected.size() && first_difference == expected.size(); ++i)
      if (expected[i] != actual[i]) first_difference = i;
    CAPTURE(first_difference);
    CHECK(first_difference == expected.size());
    compared += expected.size();
  }
  CHECK(traces >= 25);
  CHECK(compared >= 4414);
}

TEST_CASE("an explicit address trace still replays; without one the tool says so and uses the model") {
  const fs::path csv = kDir / "seq101_default.csv";
  conf::ReplayOptions options;
  options.address_script = conf::read_address_trace(conf::address_trace_path(csv));
  std::vector<std::uintptr_t> addresses;
  const conf::Result result = conf::replay(conf::read_sequence(csv), options, &addresses);
  CHECK(result.ok);
  // The script's addresses themselves, not the model's.
  REQUIRE_FALSE(addresses.empty());
  CHECK(addresses.front() == options.address_script.front());

  const fs::path tool = fs::path(CACHEALLOC_BINARY_DIR) / "bin" / "cachealloc-conformance";
  CHECK(WEXITSTATUS(std::system((tool.string() + " --addresses " + csv.string() + " > /dev/null 2>&1").c_str())) == 0);
  const fs::path dir = fs::temp_directory_path() / "cachealloc-conformance-test";
  fs::create_directories(dir);
  fs::copy_file(csv, dir / "untraced.csv", fs::copy_options::overwrite_existing);
  fs::remove(dir / "untraced.addresses");
  const fs::path note = dir / "note.txt";
  CHECK(WEXITSTATUS(std::system((tool.string() + " --addresses " + (dir / "untraced.csv").string() + " 2> " + note.string() + " > /dev/null").c_str())) == 0);
  std::ifstream in(note);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("no untraced.addresses, the driver address model places its reservations") != std::string::npos);
}

TEST_CASE("under a real memory limit the replay keeps 2 MiB of device_free back from cudaMalloc, as the driver does") {
  // Given a sequence made on the H200 with only device_free bytes left to cudaMalloc...
  auto sequence = conf::read_sequence(kDir / "seq1414_max_split_size_mb_64_free1536MiB.csv");
  REQUIRE(sequence.device_free == 1611792384);  // 1537.125 MiB
  CHECK(conf::replay(sequence).ok);
  // ...when the replay may use all of it, then row 309's cudaMalloc of 2 MiB,
  // which left 1.125 MiB free, succeeds where the driver's failed.
  sequence.device_free += 2 << 20;
  const conf::Result result = conf::replay(sequence);
  CHECK_FALSE(result.ok);
  CHECK(result.first_mismatch.row == 309);
}

TEST_CASE("device_free must be the same on every row and no more than device_total") {
  const fs::path dir = fs::temp_directory_path() / "cachealloc-conformance-test";
  fs::create_directories(dir);
  const std::string header =
      "op,id,bytes,allocated,reserved,active,inactive_split,requested,segments,device_allocs,device_frees,"
      "peak_allocated,peak_reserved,alloc_retries,ooms,device_total,memory_fraction,config,device_free\n";
  const std::string row = "alloc,0,512,512,2097152,512,2096640,512,1,2,1,512,2097152,0,0,1000000000,0.0,,";
  std::ofstream(dir / "changes.csv") << header << row << "500000000\n" << row << "400000000\n";
  CHECK_THROWS_AS(conf::read_sequence(dir / "changes.csv"), conf::FormatError);
  std::ofstream(dir / "too_much.csv") << header << row << "2000000000\n";
  CHECK_THROWS_AS(conf::read_sequence(dir / "too_much.csv"), conf::FormatError);
  std::ofstream(dir / "fine.csv") << header << row << "500000000\n";
  CHECK(conf::read_sequence(dir / "fine.csv").device_free == 500000000);
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
  const conf::Result result = conf::replay(sequence);
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
