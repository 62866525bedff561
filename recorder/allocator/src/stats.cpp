#include "cachealloc/stats.hpp"

#include <cstdio>
#include <sstream>
#include <utility>

namespace cachealloc {
namespace {

constexpr const char* kTypeNames[kStatTypes] = {"all", "small_pool", "large_pool"};

void put(std::map<std::string, std::int64_t>& out, const std::string& prefix, const Stat& stat) {
  out[prefix + ".current"] = stat.current;
  out[prefix + ".peak"] = stat.peak;
  out[prefix + ".allocated"] = stat.allocated;
  out[prefix + ".freed"] = stat.freed;
}

void put(std::map<std::string, std::int64_t>& out, const std::string& name, const StatArray& stats) {
  for (std::size_t type = 0; type < kStatTypes; ++type) put(out, name + "." + kTypeNames[type], stats[type]);
}

}  // namespace

std::map<std::string, std::int64_t> MemoryStats::to_map() const {
  std::map<std::string, std::int64_t> out;
  put(out, "allocation", allocation);
  put(out, "segment", segment);
  put(out, "active", active);
  put(out, "inactive_split", inactive_split);
  put(out, "allocated_bytes", allocated_bytes);
  put(out, "reserved_bytes", reserved_bytes);
  put(out, "active_bytes", active_bytes);
  put(out, "inactive_split_bytes", inactive_split_bytes);
  put(out, "requested_bytes", requested_bytes);
  put(out, "oversize_allocations", oversize_allocations);
  put(out, "oversize_segments", oversize_segments);
  out["num_alloc_retries"] = num_alloc_retries;
  out["num_ooms"] = num_ooms;
  out["num_sync_all_streams"] = num_sync_all_streams;
  out["num_device_alloc"] = num_device_alloc;
  out["num_device_free"] = num_device_free;
  out["max_split_size"] = max_split_size;
  return out;
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  char text[48];
  if (unit == 0)
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(text, sizeof text, "%.2f %s", value, kUnits[unit]);
  return text;
}

std::string format_summary(const MemoryStats& stats) {
  std::ostringstream out;
  char line[160];
  const auto rule = std::string(87, '=') + "\n";
  out << rule << "|                     cachealloc memory summary                                       |\n"
      << rule;
  std::snprintf(line, sizeof line, "| %-24s | %12s | %12s | %12s | %12s |\n", "Metric", "Cur Usage", "Peak Usage",
                "Tot Alloc", "Tot Freed");
  out << line << rule;
  auto bytes_rows = [&](const char* title, const StatArray& stat) {
    for (std::size_t type = 0; type < kStatTypes; ++type) {
      const std::string name = type == 0 ? std::string(title) : std::string("  from ") + (type == 1 ? "small pool" : "large pool");
      std::snprintf(line, sizeof line, "| %-24s | %12s | %12s | %12s | %12s |\n", name.c_str(),
                    format_bytes(static_cast<std::uint64_t>(stat[type].current)).c_str(),
                    format_bytes(static_cast<std::uint64_t>(stat[type].peak)).c_str(),
                    format_bytes(static_cast<std::uint64_t>(stat[type].allocated)).c_str(),
                    format_bytes(static_cast<std::uint64_t>(stat[type].freed)).c_str());
      out << line;
    }
    out << std::string(87, '-') << "\n";
  };
  auto count_rows = [&](const char* title, const StatArray& stat) {
    for (std::size_t type = 0; type < kStatTypes; ++type) {
      const std::string name = type == 0 ? std::string(title) : std::string("  from ") + (type == 1 ? "small pool" : "large pool");
      std::snprintf(line, sizeof line, "| %-24s | %12lld | %12lld | %12lld | %12lld |\n", name.c_str(),
                    static_cast<long long>(stat[type].current), static_cast<long long>(stat[type].peak),
                    static_cast<long long>(stat[type].allocated), static_cast<long long>(stat[type].freed));
      out << line;
    }
    out << std::string(87, '-') << "\n";
  };
  bytes_rows("Allocated memory", stats.allocated_bytes);
  bytes_rows("Active memory", stats.active_bytes);
  bytes_rows("Requested memory", stats.requested_bytes);
  bytes_rows("Reserved memory", stats.reserved_bytes);
  bytes_rows("Non-releasable memory", stats.inactive_split_bytes);
  count_rows("Allocations", stats.allocation);
  count_rows("Active allocs", stats.active);
  count_rows("Device reserved segments", stats.segment);
  count_rows("Non-releasable allocs", stats.inactive_split);
  std::snprintf(line, sizeof line, "| device allocs: %-8lld device frees: %-8lld alloc retries: %-8lld OOMs: %-8lld|\n",
                static_cast<long long>(stats.num_device_alloc), static_cast<long long>(stats.num_device_free),
                static_cast<long long>(stats.num_alloc_retries), static_cast<long long>(stats.num_ooms));
  out << line << rule;
  return out.str();
}

}  // namespace cachealloc
