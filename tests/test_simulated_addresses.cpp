// The simulated device's driver address model, one placement rule at a time:
// where reserve() puts memory, relative to the model's base B. Each layout
// below is built through the public Device interface, as the allocator
// builds it. The figures are those measured on the H200 (docs/VERIFICATION.md,
// "The driver address model"); the whole-sequence ground truth is in
// test_conformance.cpp and testdata/driver/.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cachealloc/device.hpp"
#include "cachealloc/errors.hpp"

using cachealloc::Device;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::uintptr_t kBase = 0x7f0000000000ull;

std::shared_ptr<Device> fresh_device(std::uintptr_t base = kBase) {
  cachealloc::SimulatedDeviceOptions options;
  options.base_address = base;
  return cachealloc::make_simulated_device(options);
}

// Where `ptr` lies relative to B, in MiB (negative below B).
double offset_mib(const void* ptr, std::uintptr_t base = kBase) {
  return (static_cast<double>(reinterpret_cast<std::uintptr_t>(ptr)) - static_cast<double>(base)) / kMiB;
}

// One file of testdata/driver, written by probe_cudamalloc.py on the H200:
// cudaMalloc and cudaFree called directly, with the driver's answers.
struct ProbeCall {
  bool malloc = false;
  std::size_t bytes = 0;
  std::uintptr_t address = 0;  // 0: the malloc failed
  std::size_t line = 0;
};
struct Probe {
  std::uintptr_t base = 0;
  std::size_t device_free = 0;  // 0: no limit
  std::vector<ProbeCall> calls;
};

Probe read_probe(const std::filesystem::path& path) {
  std::ifstream in(path);
  REQUIRE(in);
  Probe probe;
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string op, first, second;
    fields >> op >> first;
    ProbeCall call;
    call.line = number;
    if (op == "base") {
      probe.base = std::stoull(first, nullptr, 16);
    } else if (op == "device_free") {
      probe.device_free = std::stoull(first);
    } else if (op == "malloc") {
      fields >> second;
      call.malloc = true;
      call.bytes = std::stoull(first);
      call.address = second == "fail" ? 0 : std::stoull(second, nullptr, 16);
      probe.calls.push_back(call);
    } else {
      REQUIRE(op == "free");
      call.address = std::stoull(first, nullptr, 16);
      probe.calls.push_back(call);
    }
  }
  REQUIRE(probe.base != 0);
  return probe;
}

// Fills both context chunks' free room ([B+30, B+32) and [B+104, B+128)), so
// that every later reservation needs a chunk of its own.
void fill_context_chunks(Device& device) {
  REQUIRE(offset_mib(device.reserve(2 * kMiB)) == 30);
  REQUIRE(offset_mib(device.reserve(24 * kMiB)) == 104);
}

}  // namespace

TEST_CASE("given a fresh device, the first reservation lands at B+30 MiB in the newer context chunk") {
  auto device = fresh_device();
  // Both context chunks have room for 2 MiB; [B, B+32) counts as the newer.
  CHECK(offset_mib(device->reserve(2 * kMiB)) == 30);
  // The next one no longer fits there and goes to [B+96, B+128)'s gap at B+104.
  CHECK(offset_mib(device->reserve(20 * kMiB)) == 104);
  CHECK(offset_mib(device->reserve(4 * kMiB)) == 124);
}

TEST_CASE("given a fresh device, a first 20 MiB segment lands at B+104 MiB") {
  auto device = fresh_device();
  CHECK(offset_mib(device->reserve(20 * kMiB)) == 104);
}

TEST_CASE("the context chunks are never released: freeing into them and reserving again returns the same address") {
  auto device = fresh_device();
  void* first = device->reserve(2 * kMiB);
  device->release(first, 2 * kMiB);
  // Released, [B, B+32) would leave a 32 MiB hole; a new chunk would go below B-384.
  CHECK(device->reserve(2 * kMiB) == first);
}

TEST_CASE("when no chunk has room, a new chunk takes the top of the space below B-384 MiB and the allocation its bottom") {
  auto device = fresh_device();
  // 40 MiB fits in neither context chunk: a chunk of 64 MiB at [B-448, B-384).
  CHECK(offset_mib(device->reserve(40 * kMiB)) == -448);
}

TEST_CASE("the newest chunk with room is used first, even when an older one has room too") {
  auto device = fresh_device();
  // [B-448, B-384) has 24 MiB of slack above its 40 MiB; [B+96, B+128) has 24 MiB at B+104.
  REQUIRE(offset_mib(device->reserve(40 * kMiB)) == -448);
  CHECK(offset_mib(device->reserve(20 * kMiB)) == -408);
  // Now only the older context chunk has room.
  CHECK(offset_mib(device->reserve(20 * kMiB)) == 104);
}

TEST_CASE("inside a chunk the smallest gap that fits wins, and the allocation sits at the gap's bottom") {
  auto device = fresh_device();
  fill_context_chunks(*device);
  // One 32 MiB chunk [B-416, B-384) packed with 8, 4, 8, 4, 8 MiB.
  void* a = device->reserve(8 * kMiB);
  REQUIRE(offset_mib(a) == -416);
  void* b = device->reserve(4 * kMiB);
  REQUIRE(offset_mib(b) == -408);
  void* c = device->reserve(8 * kMiB);
  REQUIRE(offset_mib(c) == -404);
  void* d = device->reserve(4 * kMiB);
  REQUIRE(offset_mib(d) == -396);
  void* e = device->reserve(8 * kMiB);
  REQUIRE(offset_mib(e) == -392);
  // Gaps of 8 MiB at B-416 and of 4 MiB at B-396: 2 MiB goes to the smaller,
  // at its bottom, although the larger comes first.
  device->release(a, 8 * kMiB);
  device->release(d, 4 * kMiB);
  CHECK(offset_mib(device->reserve(2 * kMiB)) == -396);
  // Gaps of 8 MiB at B-416 and 2 MiB at B-394: 4 MiB only fits the first.
  CHECK(offset_mib(device->reserve(4 * kMiB)) == -416);
  (void)b, (void)c, (void)e;
}

TEST_CASE("of equal gaps inside a chunk the lowest wins") {
  auto device = fresh_device();
  fill_context_chunks(*device);
  void* low = device->reserve(8 * kMiB);   // [B-416, B-408)
  void* mid = device->reserve(16 * kMiB);  // [B-408, B-392)
  void* high = device->reserve(8 * kMiB);  // [B-392, B-384)
  REQUIRE(offset_mib(low) == -416);
  REQUIRE(offset_mib(high) == -392);
  device->release(high, 8 * kMiB);
  device->release(low, 8 * kMiB);
  CHECK(offset_mib(device->reserve(8 * kMiB)) == -416);
  CHECK(offset_mib(device->reserve(8 * kMiB)) == -392);
  (void)mid;
}

TEST_CASE("a new chunk is the size rounded up to 32 MiB: its slack takes later allocations") {
  auto device = fresh_device();
  fill_context_chunks(*device);
  // 32 MiB exactly is a chunk of 32 MiB, with no slack.
  CHECK(offset_mib(device->reserve(32 * kMiB)) == -416);
  // 34 MiB is a chunk of 64 MiB below it: [B-480, B-416).
  CHECK(offset_mib(device->reserve(34 * kMiB)) == -480);
  // Its 30 MiB of slack, at B-446, take a 30 MiB allocation.
  CHECK(offset_mib(device->reserve(30 * kMiB)) == -446);
  // A chunk of 32 MiB again: nothing left above.
  CHECK(offset_mib(device->reserve(2 * kMiB)) == -512);
}

TEST_CASE("holes are scanned top-down: a new chunk takes the top of the highest hole larger than it") {
  auto device = fresh_device();
  fill_context_chunks(*device);
  // Four full 32 MiB chunks, [B-416, B-384) down to [B-512, B-480).
  void* chunks[4];
  for (int i = 0; i < 4; ++i) {
    chunks[i] = device->reserve(32 * kMiB);
    REQUIRE(offset_mib(chunks[i]) == -416 - 32 * i);
  }
  // Releasing the middle two leaves one hole of 64 MiB, [B-480, B-416).
  device->release(chunks[1], 32 * kMiB);
  device->release(chunks[2], 32 * kMiB);
  // A 32 MiB chunk takes its top, not the bottom of the hole nor the space below all chunks.
  CHECK(offset_mib(device->reserve(32 * kMiB)) == -448);
}

TEST_CASE("a hole of exactly the new chunk's size is skipped") {
  auto device = fresh_device();
  fill_context_chunks(*device);
  void* chunks[3];
  for (int i = 0; i < 3; ++i) chunks[i] = device->reserve(32 * kMiB);  // B-416, B-448, B-480
  REQUIRE(offset_mib(chunks[2]) == -480);
  // A hole of exactly 32 MiB at [B-448, B-416)...
  device->release(chunks[1], 32 * kMiB);
  // ...does not take a 32 MiB chunk: it goes below the lowest chunk.
  CHECK(offset_mib(device->reserve(32 * kMiB)) == -512);
  // A smaller chunk is not possible (32 MiB is the least), but a smaller
  // allocation's 32 MiB chunk is skipped the same way.
  CHECK(offset_mib(device->reserve(2 * kMiB)) == -544);
}

TEST_CASE("the space between B-384 MiB and the context chunks is never used") {
  auto device = fresh_device();
  fill_context_chunks(*device);
  void* top = device->reserve(32 * kMiB);  // [B-416, B-384)
  void* below = device->reserve(32 * kMiB);  // [B-448, B-416)
  REQUIRE(offset_mib(below) == -448);
  device->release(top, 32 * kMiB);
  // [B-416, B) is free, but only [B-416, B-384) counts: exactly 32 MiB, skipped.
  CHECK(offset_mib(device->reserve(32 * kMiB)) == -480);
  // 64 MiB would not fit there either, and goes below as well.
  CHECK(offset_mib(device->reserve(64 * kMiB)) == -544);
}

TEST_CASE("a chunk left with no allocations is released; one with an allocation left stays") {
  SUBCASE("emptied: the next small reservation makes a new chunk at the top") {
    auto device = fresh_device();
    fill_context_chunks(*device);
    void* big = device->reserve(40 * kMiB);  // chunk [B-448, B-384)
    REQUIRE(offset_mib(big) == -448);
    device->release(big, 40 * kMiB);
    // Had the chunk stayed, 8 MiB would sit at its bottom, B-448.
    CHECK(offset_mib(device->reserve(8 * kMiB)) == -416);
  }
  SUBCASE("not emptied: the chunk's gap takes the reservation") {
    auto device = fresh_device();
    fill_context_chunks(*device);
    void* big = device->reserve(40 * kMiB);
    REQUIRE(offset_mib(device->reserve(20 * kMiB)) == -408);
    device->release(big, 40 * kMiB);
    CHECK(offset_mib(device->reserve(8 * kMiB)) == -448);
  }
}

TEST_CASE("only the layout relative to B matters: another base gives the same offsets") {
  const std::uintptr_t other = 0x7f85ce000000ull;  // the H200's B in seq101_default's trace
  auto device = fresh_device(other);
  CHECK(offset_mib(device->reserve(2 * kMiB), other) == 30);
  CHECK(offset_mib(device->reserve(160 * kMiB), other) == -544);
  CHECK(offset_mib(device->reserve(20 * kMiB), other) == 104);
}

TEST_CASE("a base that is not 32 MiB aligned is rejected") {
  cachealloc::SimulatedDeviceOptions options;
  options.base_address = kBase + 2 * kMiB;
  CHECK_THROWS_AS(cachealloc::make_simulated_device(options), cachealloc::InvalidArgument);
}

TEST_CASE("a reservation refused for capacity leaves the layout as it was") {
  cachealloc::SimulatedDeviceOptions options;
  options.capacity = 100 * kMiB;
  auto device = cachealloc::make_simulated_device(options);
  REQUIRE(offset_mib(device->reserve(40 * kMiB)) == -448);
  CHECK(device->reserve(80 * kMiB) == nullptr);
  // Capacity counts bytes as before (40 + 60 = 100 MiB fits), and the
  // refused call made no chunk: 20 MiB still goes to the 40 MiB one's slack.
  CHECK(offset_mib(device->reserve(20 * kMiB)) == -408);
  CHECK(device->memory_info().free == 40 * kMiB);
}

TEST_CASE("expandable segments' address ranges come from elsewhere and leave cudaMalloc's layout alone") {
  auto device = fresh_device();
  void* range = device->reserve_address_range(64 * kMiB);
  REQUIRE(range != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(range) >= kBase + 128 * kMiB);
  REQUIRE(device->map(range, 64 * kMiB, 2 * kMiB));
  CHECK(offset_mib(device->reserve(2 * kMiB)) == 30);
  CHECK(offset_mib(device->reserve(40 * kMiB)) == -448);
  device->unmap(range, 64 * kMiB, 2 * kMiB);
  device->release_address_range(range, 64 * kMiB);
}

TEST_CASE("an address script overrides the model: scripted addresses come back as given") {
  cachealloc::SimulatedDeviceOptions options;
  options.address_script = {0x7f85cfe00000ull, 0x7f85ac000000ull};
  auto device = cachealloc::make_simulated_device(options);
  CHECK(reinterpret_cast<std::uintptr_t>(device->reserve(2 * kMiB)) == 0x7f85cfe00000ull);
  CHECK(reinterpret_cast<std::uintptr_t>(device->reserve(160 * kMiB)) == 0x7f85ac000000ull);
}

TEST_CASE("every cudaMalloc the H200's driver answered in testdata/driver lands where the model puts it") {
  const std::filesystem::path dir = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "driver";
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".calls") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 2);
  std::size_t mallocs = 0, failures = 0;
  for (const auto& file : files) {
    CAPTURE(file.filename().string());
    // Given the driver's answers to a run of direct calls...
    const Probe probe = read_probe(file);
    cachealloc::SimulatedDeviceOptions options;
    options.base_address = kBase;
    // Under a real limit the driver keeps about 2 MiB of its free memory back.
    if (probe.device_free) options.capacity = probe.device_free - 2 * kMiB;
    auto device = cachealloc::make_simulated_device(options);
    // ...when the same calls reach the simulated device, then each returns
    // the same offset from B, and fails where the driver's failed.
    std::map<std::uintptr_t, std::pair<void*, std::size_t>> live;  // the driver's address -> ours
    for (const ProbeCall& call : probe.calls) {
      CAPTURE(call.line);
      if (!call.malloc) {
        auto it = live.find(call.address);
        REQUIRE(it != live.end());
        device->release(it->second.first, it->second.second);
        live.erase(it);
        continue;
      }
      ++mallocs;
      void* ptr = device->reserve(call.bytes);
      if (call.address == 0) {
        ++failures;
        REQUIRE(ptr == nullptr);
        continue;
      }
      REQUIRE(ptr != nullptr);
      REQUIRE(offset_mib(ptr) == offset_mib(reinterpret_cast<void*>(call.address), probe.base));
      live[call.address] = {ptr, call.bytes};
    }
  }
  CHECK(mallocs > 600);
  CHECK(failures > 100);
}
