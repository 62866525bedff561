// Replays operation sequences recorded from PyTorch's allocator (the CSV
// format of shared/conformance: one row per operation with PyTorch's figures
// after it) on our allocator over a simulated device, and compares every
// figure of every row.
//
// Thread safety: functions are reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace cachealloc::conformance {

// The figures compared after every row, in file order.
inline constexpr const char* kFigures[] = {"allocated",     "reserved",       "active",       "inactive_split",
                                           "requested",     "segments",       "device_allocs", "device_frees",
                                           "peak_allocated", "peak_reserved", "alloc_retries", "ooms"};
inline constexpr std::size_t kFigureCount = std::size(kFigures);

struct Row {
  std::size_t line = 0;  // 1-based line in the file (the header is line 1)
  std::string op;        // alloc, free, empty_cache, oom
  std::string id;
  std::uint64_t bytes = 0;
  std::int64_t figures[kFigureCount] = {};
};

struct Sequence {
  std::filesystem::path path;
  std::uint64_t device_total = 0;
  // The optional column device_free: the driver's free memory after the
  // preamble, when make_sequence.py held the rest (CONF_DEVICE_FREE) so that
  // cudaMalloc itself runs out. 0: no such limit.
  std::uint64_t device_free = 0;
  double memory_fraction = 0;
  std::string config;
  std::vector<Row> rows;
};

// Thrown for a missing, unreadable or malformed file; what() is one line
// naming the file and line.
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

Sequence read_sequence(const std::filesystem::path& path);

struct Mismatch {
  std::size_t row = 0;   // 1-based row number (excluding the header)
  std::size_t line = 0;  // line in the file
  std::string op;
  std::string id;
  std::uint64_t bytes = 0;
  std::vector<std::string> figures;  // names of the figures that differ
  std::int64_t expected[kFigureCount] = {};
  std::int64_t actual[kFigureCount] = {};
  std::string note;  // e.g. "expected an OOM, the allocation succeeded"
};

struct Result {
  std::size_t rows = 0;      // rows in the file
  std::size_t matched = 0;   // rows that matched before the first mismatch
  bool ok = false;
  Mismatch first_mismatch;   // valid when !ok
  // On the cuda device, for a sequence with device_free: the free memory
  // once the rest was held, which can exceed device_free by up to 2 MiB
  // (the driver's granule). 0 otherwise.
  std::uint64_t device_free = 0;
  // The same device, at the first mismatch: the free memory then, and what
  // the allocator reserved then. device_free - reserved - free_at_mismatch
  // is memory that went elsewhere during the replay (the driver, another
  // process). 0 otherwise.
  std::uint64_t free_at_mismatch = 0;
  std::uint64_t reserved_at_mismatch = 0;
  // The last device reservation refused up to the first mismatch (0: none)
  // and the free memory just after it; with device_free, as above.
  std::uint64_t refused_bytes = 0;
  std::uint64_t refused_with_free = 0;
};

struct ReplayOptions {
  // Replay on the real GPU instead of a simulated device of
  // sequence.device_total bytes.
  bool on_cuda = false;
  // Simulated device only: the addresses a real device handed out, in order
  // (see read_address_trace), as an override. Empty: the simulated device's
  // driver address model, which places them where the real driver would.
  std::vector<std::uintptr_t> address_script;
};

// Replays `sequence` after make_sequence.py's preamble, configured by
// sequence.config and sequence.memory_fraction. With sequence.device_free,
// the device then has that much free memory left: the simulated device holds
// the rest as context overhead (and about 2 MiB more, which the driver keeps
// back from cudaMalloc), the cuda device through hold_cuda_memory.
// Stops at the first
// mismatching row. `reserved_addresses`, when given, receives every address
// the device returned, in order. Throws FormatError for a bad config string,
// DeviceError when the cuda device fails.
Result replay(const Sequence& sequence, const ReplayOptions& options = {},
              std::vector<std::uintptr_t>* reserved_addresses = nullptr);

// The address trace beside a sequence: FILE.csv -> FILE.addresses.
std::filesystem::path address_trace_path(const std::filesystem::path& sequence_path);
// One hexadecimal address per line; lines starting with '#' are comments.
// Throws FormatError.
std::vector<std::uintptr_t> read_address_trace(const std::filesystem::path& path);
void write_address_trace(const std::filesystem::path& path, const std::vector<std::uintptr_t>& addresses,
                         const std::string& comment);

}  // namespace cachealloc::conformance
