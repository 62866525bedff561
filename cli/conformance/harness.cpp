#include "harness.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "cachealloc/allocator.hpp"

namespace cachealloc::conformance {
namespace {

// RFC 4180 fields of one record; quoted fields may hold commas and "".
std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        fields.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else if (c != '\r') {
      fields.back() += c;
    }
  }
  return fields;
}

template <typename T>
T parse_number(const std::string& text, const std::string& where) {
  T value{};
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
    throw FormatError(where + ": '" + text + "' is not a number");
  return value;
}

double parse_fraction(const std::string& text, const std::string& where) {
  try {
    std::size_t used = 0;
    const double value = std::stod(text, &used);
    if (used != text.size()) throw std::invalid_argument("trailing");
    return value;
  } catch (const std::exception&) {
    throw FormatError(where + ": '" + text + "' is not a number");
  }
}

}  // namespace

Sequence read_sequence(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw FormatError(path.string() + ": is a directory");
  std::ifstream in(path);
  if (!in) throw FormatError(path.string() + ": cannot open");
  Sequence sequence;
  sequence.path = path;
  std::string line;
  if (!std::getline(in, line)) throw FormatError(path.string() + ": empty file");
  const auto header = split_csv(line);
  std::map<std::string, std::size_t> column;
  for (std::size_t i = 0; i < header.size(); ++i) column[header[i]] = i;
  auto need = [&](const std::string& name) {
    auto it = column.find(name);
    if (it == column.end()) throw FormatError(path.string() + ":1: missing column '" + name + "'");
    return it->second;
  };
  const std::size_t op_col = need("op"), id_col = need("id"), bytes_col = need("bytes");
  const std::size_t total_col = need("device_total"), fraction_col = need("memory_fraction"), config_col = need("config");
  const auto free_column = column.find("device_free");  // optional
  std::size_t figure_col[kFigureCount];
  for (std::size_t f = 0; f < kFigureCount; ++f) figure_col[f] = need(kFigures[f]);

  std::size_t number = 1;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line == "\r") continue;
    const std::string where = path.string() + ":" + std::to_string(number);
    const auto fields = split_csv(line);
    if (fields.size() != header.size())
      throw FormatError(where + ": " + std::to_string(fields.size()) + " fields, the header has " +
                        std::to_string(header.size()));
    Row row;
    row.line = number;
    row.op = fields[op_col];
    if (row.op != "alloc" && row.op != "free" && row.op != "empty_cache" && row.op != "oom")
      throw FormatError(where + ": unknown op '" + row.op + "'");
    row.id = fields[id_col];
    if (row.op != "empty_cache") row.bytes = parse_number<std::uint64_t>(fields[bytes_col], where);
    for (std::size_t f = 0; f < kFigureCount; ++f) row.figures[f] = parse_number<std::int64_t>(fields[figure_col[f]], where);
    const auto total = parse_number<std::uint64_t>(fields[total_col], where);
    const double fraction = parse_fraction(fields[fraction_col], where);
    const auto device_free = free_column == column.end() ? 0 : parse_number<std::uint64_t>(fields[free_column->second], where);
    if (sequence.rows.empty()) {
      sequence.device_total = total;
      sequence.device_free = device_free;
      sequence.memory_fraction = fraction;
      sequence.config = fields[config_col];
    } else if (total != sequence.device_total || fraction != sequence.memory_fraction ||
               fields[config_col] != sequence.config || device_free != sequence.device_free) {
      throw FormatError(where + ": device_total, device_free, memory_fraction and config must be the same on every row");
    }
    sequence.rows.push_back(std::move(row));
  }
  if (sequence.rows.empty()) throw FormatError(path.string() + ": no rows");
  if (sequence.device_total == 0) throw FormatError(path.string() + ": device_total is 0");
  if (sequence.device_free > sequence.device_total) throw FormatError(path.string() + ": device_free exceeds device_total");
  return sequence;
}

namespace {

// Forwards to a device and notes every address it reserves.
// Records the addresses the device hands out, and the last reservation it
// refused with the free memory just after.
class AddressRecorder final : public ForwardingDevice {
 public:
  AddressRecorder(std::shared_ptr<Device> inner, std::vector<std::uintptr_t>* out)
      : ForwardingDevice(std::move(inner)), out_(out) {}
  void* reserve(std::size_t bytes) override {
    void* ptr = inner_->reserve(bytes);
    if (ptr && out_) out_->push_back(reinterpret_cast<std::uintptr_t>(ptr));
    if (ptr == nullptr) {
      refused_bytes = bytes;
      refused_with_free = inner_->memory_info().free;
    }
    return ptr;
  }
  std::uint64_t refused_bytes = 0;
  std::uint64_t refused_with_free = 0;

 private:
  std::vector<std::uintptr_t>* out_;
};

}  // namespace

std::filesystem::path address_trace_path(const std::filesystem::path& sequence_path) {
  auto path = sequence_path;
  return path.replace_extension(".addresses");
}

std::vector<std::uintptr_t> read_address_trace(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw FormatError(path.string() + ": cannot open");
  std::vector<std::uintptr_t> addresses;
  std::string line;
  std::size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    std::string_view text = line;
    if (text.starts_with("0x")) text.remove_prefix(2);
    std::uintptr_t value = 0;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
      throw FormatError(path.string() + ":" + std::to_string(number) + ": '" + line + "' is not a hexadecimal address");
    addresses.push_back(value);
  }
  return addresses;
}

void write_address_trace(const std::filesystem::path& path, const std::vector<std::uintptr_t>& addresses,
                         const std::string& comment) {
  std::ofstream out(path);
  if (!out) throw FormatError(path.string() + ": cannot write");
  out << "# " << comment << "\n";
  char text[32];
  for (std::uintptr_t a : addresses) {
    std::snprintf(text, sizeof text, "0x%llx\n", static_cast<unsigned long long>(a));
    out << text;
  }
  if (!out) throw FormatError(path.string() + ": write failed");
}

Result replay(const Sequence& sequence, const ReplayOptions& replay_options,
              std::vector<std::uintptr_t>* reserved_addresses) {
  AllocatorConfig config;
  try {
    config = parse_config(sequence.config);
  } catch (const ConfigError& e) {
    throw FormatError(sequence.path.string() + ": " + e.what());
  }
  std::shared_ptr<Device> device;
  if (replay_options.on_cuda) {
    device = make_cuda_device(0);
  } else {
    SimulatedDeviceOptions options;
    options.capacity = sequence.device_total;
    // Memory held from the start (the preamble's 2 MiB fit in what is left),
    // and what the driver keeps back from cudaMalloc under a real limit.
    if (sequence.device_free) {
      const std::size_t kept = std::min<std::size_t>(sequence.device_free, kDriverFreeMemoryKept);
      options.context_overhead = sequence.device_total - sequence.device_free + kept;
    }
    options.address_script = replay_options.address_script;
    device = make_simulated_device(options);
  }
  const auto recorder = std::make_shared<AddressRecorder>(device, reserved_addresses);
  CachingAllocator allocator(recorder, config);
  // make_sequence.py's preamble: torch.empty(1) (4 bytes), empty_cache(),
  // reset_peak_memory_stats(). The device alloc/free counters are cumulative,
  // so the rows carry this one segment's reservation and release.
  allocator.deallocate(allocator.allocate(4));
  allocator.empty_cache();
  allocator.reset_peak_stats();
  Result result;
  std::shared_ptr<void> held;
  if (sequence.device_free && replay_options.on_cuda) {
    // Free memory moves in 2 MiB granules, from this process's own
    // remainder, and the hold may cost a little itself: measure after each
    // try and adjust, until the free memory is device_free or at most one
    // granule above it.
    constexpr std::size_t kGranule = std::size_t{2} << 20;
    std::size_t free_now = device->memory_info().free;
    if (free_now < sequence.device_free)
      throw DeviceError(sequence.path.string() + ": the device has " + std::to_string(free_now) +
                        " bytes free, fewer than the sequence's device_free");
    std::size_t amount = free_now - sequence.device_free;
    for (int attempt = 0; attempt < 8; ++attempt) {
      held.reset();
      held = hold_cuda_memory(device->index(), amount);
      free_now = device->memory_info().free;
      if (free_now < sequence.device_free && amount > 0) {
        amount -= std::min(amount, (sequence.device_free - free_now + kGranule - 1) / kGranule * kGranule);
      } else if (free_now >= sequence.device_free + kGranule) {
        amount += (free_now - sequence.device_free) / kGranule * kGranule;
      } else {
        break;
      }
    }
    result.device_free = free_now;
  }
  if (sequence.memory_fraction != 0) allocator.set_memory_fraction(sequence.memory_fraction);

  result.rows = sequence.rows.size();
  std::map<std::string, void*> live;
  for (std::size_t i = 0; i < sequence.rows.size(); ++i) {
    const Row& row = sequence.rows[i];
    std::string note;
    if (row.op == "alloc" || row.op == "oom") {
      try {
        void* ptr = allocator.allocate(row.bytes);
        if (row.op == "oom") note = "expected an OOM, the allocation succeeded";
        live[row.id] = ptr;
      } catch (const OutOfMemoryError&) {
        if (row.op == "alloc") note = "the allocation failed with an OOM, PyTorch's succeeded";
      }
    } else if (row.op == "free") {
      auto it = live.find(row.id);
      if (it == live.end()) throw FormatError(sequence.path.string() + ":" + std::to_string(row.line) + ": free of unknown id " + row.id);
      allocator.deallocate(it->second);
      live.erase(it);
    } else {
      allocator.empty_cache();
    }
    const MemoryStats s = allocator.stats();
    const std::int64_t actual[kFigureCount] = {
        s.allocated_bytes[stat_all].current, s.reserved_bytes[stat_all].current, s.active_bytes[stat_all].current,
        s.inactive_split_bytes[stat_all].current, s.requested_bytes[stat_all].current, s.segment[stat_all].current,
        s.num_device_alloc, s.num_device_free, s.allocated_bytes[stat_all].peak, s.reserved_bytes[stat_all].peak,
        s.num_alloc_retries, s.num_ooms};
    Mismatch mismatch;
    for (std::size_t f = 0; f < kFigureCount; ++f) {
      mismatch.expected[f] = row.figures[f];
      mismatch.actual[f] = actual[f];
      if (actual[f] != row.figures[f]) mismatch.figures.emplace_back(kFigures[f]);
    }
    if (!mismatch.figures.empty() || !note.empty()) {
      mismatch.row = i + 1;
      mismatch.line = row.line;
      mismatch.op = row.op;
      mismatch.id = row.id;
      mismatch.bytes = row.bytes;
      mismatch.note = note;
      result.first_mismatch = std::move(mismatch);
      if (result.device_free != 0) {
        result.free_at_mismatch = device->memory_info().free;
        result.reserved_at_mismatch = static_cast<std::uint64_t>(s.reserved_bytes[stat_all].current);
        result.refused_bytes = recorder->refused_bytes;
        result.refused_with_free = recorder->refused_with_free;
      }
      return result;
    }
    ++result.matched;
  }
  for (auto& [id, ptr] : live) allocator.deallocate(ptr);
  result.ok = true;
  return result;
}

}  // namespace cachealloc::conformance
