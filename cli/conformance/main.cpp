// cachealloc-conformance FILE.csv... : replays PyTorch allocator sequences and
// compares every figure. Exit 0 all match, 1 a mismatch (the verdict, as for
// diff), 2 bad usage or bad input (one line, "cachealloc-conformance: error: ...").
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "../common/conventions.hpp"
#include "harness.hpp"
#include "cachealloc/errors.hpp"

namespace conf = cachealloc::conformance;

namespace {

void print_mismatch(const std::string& file, const conf::Result& result) {
  const conf::Mismatch& m = result.first_mismatch;
  std::printf("%s: %zu/%zu rows match; first mismatch at row %zu (line %zu): %s", file.c_str(), result.matched,
              result.rows, m.row, m.line, m.op.c_str());
  if (!m.id.empty()) std::printf(" id %s", m.id.c_str());
  if (m.op != "empty_cache") std::printf(" %llu bytes", static_cast<unsigned long long>(m.bytes));
  std::printf("\n");
  if (!m.note.empty()) std::printf("  %s\n", m.note.c_str());
  for (std::size_t f = 0; f < conf::kFigureCount; ++f) {
    const bool differs = m.expected[f] != m.actual[f];
    std::printf("  %s %-15s expected %15lld  got %15lld\n", differs ? "*" : " ", conf::kFigures[f],
                static_cast<long long>(m.expected[f]), static_cast<long long>(m.actual[f]));
  }
}

}  // namespace

int main(int argc, char** argv) {
  constexpr const char* kProgram = "cachealloc-conformance";
  CLI::App app{"Replay allocator sequences recorded from PyTorch and compare every figure after every row.\n"
               "The simulated device places reservations where the CUDA driver does (its driver address model);\n"
               "--addresses replays FILE.addresses, a real GPU's recorded address order, instead.\n\n"
               "Examples:\n"
               "  cachealloc-conformance testdata/conformance/*.csv\n"
               "  cachealloc-conformance --device cuda --record-addresses out/ seq.csv\n"
               "Exit status: 0 every row matches; 1 a row differs (the verdict, as diff(1) says it); 2 bad usage or\n"
               "an unreadable sequence (one line on stderr)."};
  std::vector<std::string> files;
  std::string device = "simulated";
  std::string record_dir;
  bool use_addresses = false;
  app.add_option("files", files, "sequence CSV files (the format of shared/conformance)")->required();
  app.add_option("--device", device, "simulated or cuda")->check(cachealloc::cli::one_of({"simulated", "cuda"}));
  app.add_option("--record-addresses", record_dir, "write FILE.addresses of the device's reservations into DIR");
  app.add_flag("--addresses", use_addresses,
               "simulated device: replay FILE.addresses beside each FILE.csv, where there is one, instead of the driver "
               "address model");
  cachealloc::cli::add_version_flags(app, std::string(kProgram) + " " CACHEALLOC_VERSION);
  if (const auto stop = cachealloc::cli::parse(app, kProgram, std::vector<std::string>(argv + 1, argv + argc)))
    return *stop;
  int status = 0;
  for (const auto& file : files) {
    try {
      const conf::Sequence sequence = conf::read_sequence(file);
      conf::ReplayOptions options;
      options.on_cuda = device == "cuda";
      const auto trace = conf::address_trace_path(file);
      if (use_addresses && !options.on_cuda) {
        if (std::filesystem::exists(trace)) options.address_script = conf::read_address_trace(trace);
        else std::fprintf(stderr, "note: %s: no %s, the driver address model places its reservations\n", file.c_str(), trace.filename().c_str());
      }
      std::vector<std::uintptr_t> reserved;
      const conf::Result result = conf::replay(sequence, options, &reserved);
      if (result.device_free && result.device_free != sequence.device_free)
        std::fprintf(stderr, "note: %s: %llu bytes free after the hold, the sequence had %llu\n", file.c_str(),
                     static_cast<unsigned long long>(result.device_free),
                     static_cast<unsigned long long>(sequence.device_free));
      if (!record_dir.empty())
        conf::write_address_trace(std::filesystem::path(record_dir) / trace.filename(), reserved,
                                  "device reservations, in order, replaying " + std::filesystem::path(file).filename().string() +
                                      " on " + device);
      if (result.ok) {
        std::printf("%s: %zu/%zu rows match\n", file.c_str(), result.matched, result.rows);
        continue;
      }
      status = 1;
      print_mismatch(file, result);
      if (result.free_at_mismatch != 0) {
        const long long elsewhere = static_cast<long long>(result.device_free) -
                                    static_cast<long long>(result.reserved_at_mismatch) -
                                    static_cast<long long>(result.free_at_mismatch);
        std::fprintf(stderr,
                     "note: %s: at the mismatch %llu bytes were free; the hold left %llu and the allocator "
                     "reserved %llu, so %lld bytes went elsewhere during the replay\n",
                     file.c_str(), static_cast<unsigned long long>(result.free_at_mismatch),
                     static_cast<unsigned long long>(result.device_free),
                     static_cast<unsigned long long>(result.reserved_at_mismatch), elsewhere);
        if (result.refused_bytes != 0) {
          const double spare_mib = (static_cast<double>(result.refused_with_free) -
                                    static_cast<double>(result.refused_bytes)) / 1048576.0;
          std::fprintf(stderr,
                       "note: %s: the last cudaMalloc the driver refused asked %llu bytes with %llu free (%.3f MiB to "
                       "spare)%s\n",
                       file.c_str(), static_cast<unsigned long long>(result.refused_bytes),
                       static_cast<unsigned long long>(result.refused_with_free), spare_mib,
                       spare_mib > 1.0 && spare_mib < 8.0
                           ? ": near a full device the driver grants such a request in some processes and refuses it "
                             "in others, so PyTorch's row there is one draw (docs/VERIFICATION.md, \"The driver's "
                             "margin near a full device varies between processes\")"
                           : "");
        }
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: error: %s\n", kProgram, e.what());
      return 2;
    }
  }
  return status;
}
