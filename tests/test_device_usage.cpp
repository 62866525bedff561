// The third view: what nvidia-smi shows (NVML) for this process and the
// whole device, recorded at the dump and at every OOM, and the summary's
// chain from allocated to the device's total. The simulated device's figures
// are the ground truth here; the cuda backend's are held to nvidia-smi on
// the H200 (docs/VERIFICATION.md, "NVML's figures against nvidia-smi").
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "../analyzer/testing/parsers.hpp"
#include "allocator_support.hpp"
#include "cachealloc/analyzer/reports.hpp"
#include "cachealloc/errors.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/pickle.hpp"

using namespace cachealloc;
using test_support::MiB;

namespace {

constexpr std::uint64_t GiB = 1ull << 30;

std::string rendered(const analyzer::Document& document, analyzer::Format format) {
  std::ostringstream out;
  analyzer::render(document, format, out);
  return out.str();
}

analyzer::testing::Json summary_json(const snapshot::Snapshot& snap, analyzer::ReportOptions options = {}) {
  return analyzer::testing::parse_json(rendered(analyzer::summary_report(snap, options), analyzer::Format::json));
}

bool is_null(const analyzer::testing::Json& value) { return std::holds_alternative<std::nullptr_t>(value.value); }

// A simulated H200 with a 500 MiB context and two other processes holding 3 GiB.
std::shared_ptr<Device> shared_device(std::size_t capacity = 150109880320ull) {
  SimulatedDeviceOptions options;
  options.capacity = capacity;
  options.context_overhead = 500 * MiB;
  options.other_processes_bytes = 3 * GiB;
  options.other_processes = 2;
  return make_simulated_device(options);
}

// A 2 GiB device with a 100 MiB context that 1.5 GiB of one other process shares.
std::shared_ptr<Device> crowded_device() {
  SimulatedDeviceOptions options;
  options.capacity = 2 * GiB;
  options.context_overhead = 100 * MiB;
  options.other_processes_bytes = 1536 * MiB;
  options.other_processes = 1;
  return make_simulated_device(options);
}

}  // namespace

TEST_CASE("the simulated device's NVML figures count its context, every reservation and the other processes") {
  // given a simulated device with a context and other processes, an allocator on it
  // and 64 MiB reserved outside the allocator (a raw cudaMalloc)
  auto device = shared_device();
  CachingAllocator allocator(device);
  void* tensor = allocator.allocate(100 * MiB);
  void* raw = device->reserve(64 * MiB);
  // when NVML's figures are read
  const DeviceUsage usage = device->usage();
  const MemoryInfo driver = device->memory_info();
  // then this process holds context + reserved + the raw allocation, the device adds the others
  CHECK(usage.source == DeviceUsage::Source::simulated);
  CHECK(usage.process_found);
  CHECK(usage.process_used == 500 * MiB + allocator.memory_reserved() + 64 * MiB);
  CHECK(usage.device_used == usage.process_used + 3 * GiB);
  CHECK(usage.other_processes == 2);
  CHECK(usage.other_processes_used == 3 * GiB);
  CHECK(usage.device_total == 150109880320ull);  // no driver reservation by default
  // and cudaMemGetInfo's free is what nobody holds
  CHECK(driver.free == driver.total - usage.device_used);
  device->release(raw, 64 * MiB);
  allocator.deallocate(tensor);
}

TEST_CASE("a dump records NVML's reading and the summary chains allocated to the device total, one remainder per step") {
  // given a recording on a shared simulated device, with a raw reservation outside the allocator
  auto device = shared_device();
  CachingAllocator allocator(device);
  HistoryRecorder history(allocator, HistoryOptions{});
  void* a = allocator.allocate(30 * MiB);
  void* b = allocator.allocate(7 * MiB);
  allocator.deallocate(b);
  void* raw = device->reserve(64 * MiB);
  const DeviceUsage truth = device->usage();
  // when the history is dumped (and written and read back in our format)
  const snapshot::Snapshot snap = snapshot::decode(snapshot::encode(history.take_snapshot()));
  // then the device holds one reading, at the dump, equal to the device's own figures
  REQUIRE(snap.devices.size() == 1);
  const snapshot::DeviceInfo& info = snap.devices[0];
  CHECK(info.usage_source == snapshot::UsageSource::simulated);
  REQUIRE(info.usage.size() == 1);
  CHECK(info.usage[0].event == snapshot::kUsageAtDump);
  CHECK(info.usage[0].process_used == truth.process_used);
  CHECK(info.usage[0].device_used == truth.device_used);
  // and the summary's chain names each remainder and adds up, step by step
  const auto json = summary_json(snap);
  const auto& gap = json["gap"];
  const std::uint64_t reserved = allocator.memory_reserved();
  CHECK(gap["allocated"].number() == static_cast<double>(allocator.memory_allocated()));
  CHECK(gap["reserved"].number() == static_cast<double>(reserved));
  CHECK(gap["process_outside_allocator"].number() == static_cast<double>(500 * MiB + 64 * MiB));
  CHECK(gap["process_used"].number() == static_cast<double>(truth.process_used));
  CHECK(gap["outside_process"].number() == static_cast<double>(3 * GiB));
  CHECK(gap["other_processes_used"].number() == static_cast<double>(3 * GiB));
  CHECK(gap["other_processes"].number() == 2);
  CHECK(gap["device_used"].number() == static_cast<double>(truth.device_used));
  CHECK(gap["device_free"].number() + gap["device_reserved"].number() + gap["device_used"].number() ==
        gap["device_total"].number());
  CHECK(gap["reserved"].number() + gap["process_outside_allocator"].number() == gap["process_used"].number());
  CHECK(gap["process_used"].number() + gap["outside_process"].number() == gap["device_used"].number());
  // and the table labels each figure with the tool that shows it
  const std::string table = rendered(analyzer::summary_report(snap, {}), analyzer::Format::table);
  for (const char* label : {"allocated (torch.cuda.memory_allocated())", "= reserved (torch.cuda.memory_reserved())",
                            "+ CUDA context and other allocators in this process",
                            "= this process on the device (nvidia-smi, this process)",
                            "+ other processes (2) and memory no process holds", "= device used (nvidia-smi memory.used)",
                            "= device total (nvidia-smi memory.total)"}) {
    CAPTURE(label);
    CHECK(table.find(label) != std::string::npos);
  }
  // and the cudaMemGetInfo line, which mixes the three, is left to JSON
  CHECK(table.find("outside the allocator (CUDA context, other allocators and processes)") == std::string::npos);
  CHECK(gap["driver_used"].number() == gap["device_used"].number());
  device->release(raw, 64 * MiB);
  allocator.deallocate(a);
}

TEST_CASE("an OOM records NVML's reading at its event; a range shows it only where it was measured") {
  // given a 2 GiB device that 1.5 GiB of other processes share, and a recording
  auto device = crowded_device();
  CachingAllocator allocator(device);
  HistoryRecorder history(allocator, HistoryOptions{});
  void* held = allocator.allocate(200 * MiB);
  // when an allocation fails for lack of memory, and the dump follows after a free
  CHECK_THROWS_AS((void)allocator.allocate(400 * MiB), OutOfMemoryError);
  const std::uint64_t reserved_at_oom = allocator.memory_reserved();
  allocator.deallocate(held);
  allocator.empty_cache();
  const snapshot::Snapshot snap = snapshot::decode(snapshot::encode(history.take_snapshot()));
  // then the device holds two readings: the OOM's, at its event, and the dump's
  const snapshot::DeviceInfo& info = snap.devices[0];
  REQUIRE(info.usage.size() == 2);
  const std::uint64_t oom_event = info.usage[0].event;
  REQUIRE(oom_event < snap.events.size());
  CHECK(snap.events[oom_event].kind == snapshot::EventKind::oom);
  CHECK(info.usage[0].process_used == 100 * MiB + reserved_at_oom);
  CHECK(info.usage[0].time_ns == snap.events[oom_event].time_ns);
  CHECK(info.usage[1].event == snapshot::kUsageAtDump);
  CHECK(info.usage[1].process_used == 100 * MiB);
  // and the summary at the OOM shows that moment's chain
  analyzer::ReportOptions at_oom;
  at_oom.window = {0, static_cast<std::size_t>(oom_event) + 1};
  const auto json = summary_json(snap, at_oom);
  CHECK(json["gap"]["reserved"].number() == static_cast<double>(reserved_at_oom));
  CHECK(json["gap"]["process_used"].number() == static_cast<double>(100 * MiB + reserved_at_oom));
  CHECK(json["gap"]["process_outside_allocator"].number() == static_cast<double>(100 * MiB));
  CHECK(json["gap"]["outside_process"].number() == static_cast<double>(1536 * MiB));
  // and the oom report names the memory beside the allocator that filled the device
  const analyzer::Document oom = analyzer::oom_report(snap, {});
  const auto oom_json = analyzer::testing::parse_json(rendered(oom, analyzer::Format::json));
  CHECK(oom_json["ooms"].array().at(0)["process_used"].number() == static_cast<double>(100 * MiB + reserved_at_oom));
  CHECK(oom_json["ooms"].array().at(0)["other_processes_used"].number() == static_cast<double>(1536 * MiB));
  const std::string oom_table = rendered(oom, analyzer::Format::table);
  CHECK(oom_table.find("beside the allocator, this process held 100.00 MiB (CUDA context and other allocators) and 1 "
                       "other process(es) 1.50 GiB, by nvidia-smi's figures") != std::string::npos);
  // and a moment before it, where nothing was measured, leaves every device figure unknown
  analyzer::ReportOptions before;
  before.window = {0, static_cast<std::size_t>(oom_event)};
  const auto earlier = summary_json(snap, before);
  for (const char* key : {"process_used", "process_outside_allocator", "device_used", "device_total", "driver_used"}) {
    CAPTURE(key);
    CHECK(is_null(earlier["gap"][key]));
  }
}

TEST_CASE("a streamed recording keeps NVML's reading at each OOM, at its event, as a dump does") {
  // given a 2 GiB device that 1.5 GiB of other processes share, and a recording streamed to a file
  auto device = crowded_device();
  CachingAllocator allocator(device);
  const std::filesystem::path path = std::filesystem::path(CACHEALLOC_BINARY_DIR) / "test_device_usage_oom.stream";
  HistoryOptions history_options;
  history_options.stream = path;
  HistoryRecorder history(allocator, history_options);
  void* held = allocator.allocate(200 * MiB);
  // when two allocations fail for lack of memory, and the stream ends after a free
  CHECK_THROWS_AS((void)allocator.allocate(400 * MiB), OutOfMemoryError);
  const std::uint64_t reserved_at_oom = allocator.memory_reserved();
  CHECK_THROWS_AS((void)allocator.allocate(500 * MiB), OutOfMemoryError);
  allocator.deallocate(held);
  allocator.empty_cache();
  history.stop();
  const snapshot::Snapshot snap = snapshot::read_snapshot(path);
  // then its trailer holds three readings: each OOM's, at its event, and the end's
  const snapshot::DeviceInfo& info = snap.devices.at(0);
  REQUIRE(info.usage.size() == 3);
  for (std::size_t i = 0; i < 2; ++i) {
    const std::uint64_t oom_event = info.usage[i].event;
    REQUIRE(oom_event < snap.events.size());
    CHECK(snap.events[oom_event].kind == snapshot::EventKind::oom);
    CHECK(info.usage[i].time_ns == snap.events[oom_event].time_ns);
    CHECK(info.usage[i].process_used == 100 * MiB + reserved_at_oom);
  }
  CHECK(info.usage[0].event < info.usage[1].event);
  CHECK(info.usage[2].event == snapshot::kUsageAtDump);
  CHECK(info.usage[2].process_used == 100 * MiB);
  // and the oom report has the figures, not unknown
  const analyzer::Document oom = analyzer::oom_report(snap, {});
  const auto oom_json = analyzer::testing::parse_json(rendered(oom, analyzer::Format::json));
  CHECK(oom_json["ooms"].array().at(0)["process_used"].number() == static_cast<double>(100 * MiB + reserved_at_oom));
  std::filesystem::remove(path);
}

TEST_CASE("NVML missing: the reading says why and its figures are unknown, never 0") {
  // given a library name that does not exist, and then a bus id no device has
  const DeviceUsage missing = read_nvml_usage("0000:00:00.0", "libcachealloc-no-such-nvml.so.1");
  const DeviceUsage no_device = read_nvml_usage("0000:ff:1f.7");
  // then both are unavailable, with one line saying why
  CHECK(missing.source == DeviceUsage::Source::unavailable);
  CHECK(missing.note.find("libcachealloc-no-such-nvml.so.1 not found") != std::string::npos);
  CHECK(missing.note.find('\n') == std::string::npos);
  CHECK(no_device.source == DeviceUsage::Source::unavailable);
  CHECK(!no_device.note.empty());

  // given a snapshot whose recorder could not read NVML
  auto device = shared_device();
  CachingAllocator allocator(device);
  HistoryRecorder history(allocator, HistoryOptions{});
  void* a = allocator.allocate(3 * MiB);
  snapshot::Snapshot snap = history.take_snapshot();
  snap.devices[0].usage_source = snapshot::UsageSource::unavailable;
  snap.devices[0].usage_note = missing.note;
  snap.devices[0].usage.clear();
  snap = snapshot::decode(snapshot::encode(snap));
  // when it is summarized
  const analyzer::Document report = analyzer::summary_report(snap, {});
  const auto json = summary_json(snap);
  const std::string table = rendered(report, analyzer::Format::table);
  // then NVML's figures are null, the reason is stated, and the driver's chain stands in
  for (const char* key : {"process_used", "process_outside_allocator", "outside_process", "device_used",
                          "device_total", "device_free"}) {
    CAPTURE(key);
    CHECK(is_null(json["gap"][key]));
  }
  CHECK(json["gap"]["driver_used"].is_number());
  CHECK(table.find("NVML (nvidia-smi's figures): unavailable when recorded: libcachealloc-no-such-nvml.so.1 not found") !=
        std::string::npos);
  CHECK(table.find("outside the allocator (CUDA context, other allocators and processes)") != std::string::npos);
  CHECK(table.find("this process on the device") == std::string::npos);
  allocator.deallocate(a);
}

TEST_CASE("the cuda backend reads NVML for this process, and the simulated device says it models it") {
  // given the test device (the H200 when CACHEALLOC_TEST_DEVICE=cuda)
  auto device = test_support::test_device();
  CachingAllocator allocator(device);
  void* a = allocator.allocate(256 * MiB);
  // when NVML's figures are read
  const DeviceUsage usage = device->usage();
  // then they come from NVML on a GPU, from the model otherwise, and this process holds at least what is reserved
  if (test_support::on_cuda()) {
    CHECK(usage.source == DeviceUsage::Source::nvml);
    CHECK(usage.note.rfind("driver ", 0) == 0);
  } else {
    CHECK(usage.source == DeviceUsage::Source::simulated);
  }
  REQUIRE(usage.process_found);
  CHECK(usage.process_used >= allocator.memory_reserved());
  CHECK(usage.device_used >= usage.process_used);
  CHECK(usage.device_used + usage.device_reserved <= usage.device_total);
  allocator.deallocate(a);
}

TEST_CASE("format version 5 keeps NVML's readings; a reading that names no OOM is refused") {
  // given a snapshot with a dump reading and a reading claiming a non-OOM event
  auto device = shared_device();
  CachingAllocator allocator(device);
  HistoryRecorder history(allocator, HistoryOptions{});
  void* a = allocator.allocate(3 * MiB);
  snapshot::Snapshot snap = history.take_snapshot();
  REQUIRE(!snap.events.empty());
  CHECK(snapshot::decode(snapshot::encode(snap)).devices == snap.devices);
  // and a conversion to a PyTorch pickle, which has no place for them, says it drops them
  const auto losses = snapshot::pickle_conversion_losses(snap);
  CHECK(std::find(losses.begin(), losses.end(),
                  "1 NVML reading(s) of this process's and the device's memory (nvidia-smi's figures)") != losses.end());
  snapshot::DeviceUsage bogus = snap.devices[0].usage.back();
  bogus.event = 0;  // an alloc, not an OOM
  snap.devices[0].usage.insert(snap.devices[0].usage.begin(), bogus);
  // when it is validated, then it is refused with the event named
  try {
    snapshot::validate(snap);
    FAIL("expected a SnapshotError");
  } catch (const snapshot::SnapshotError& e) {
    CHECK(std::string(e.what()).find("names event 0, which is not an OOM of the trace") != std::string::npos);
  }
  // and figures beyond the device's total are refused too
  snap.devices[0].usage.erase(snap.devices[0].usage.begin());
  snap.devices[0].usage.back().device_used = snap.devices[0].usage.back().device_total + 1;
  CHECK_THROWS_AS(snapshot::validate(snap), snapshot::SnapshotError);
  allocator.deallocate(a);
}

TEST_CASE("the simulated device's context and other processes are set by CACHEALLOC_SIMULATED's text") {
  // given a text with every key
  const SimulatedDeviceOptions options =
      simulated_options_from_text("capacity=80GiB,context=520MiB,other_processes=3,other_processes_bytes=6GiB");
  // then each lands in its option
  CHECK(options.capacity == 80 * GiB);
  CHECK(options.context_overhead == 520 * MiB);
  CHECK(options.other_processes == 3);
  CHECK(options.other_processes_bytes == 6 * GiB);
  // and the empty text gives the H200 as measured: nvidia-smi's total is
  // cudaMemGetInfo's plus the driver's reservation
  const SimulatedDeviceOptions h200 = simulated_options_from_text("");
  CHECK(h200.capacity == 150109880320ull);
  CHECK(h200.context_overhead == 518 * MiB);
  CHECK(h200.capacity + h200.driver_reserved == 143771ull * MiB);
  const DeviceUsage usage = make_simulated_device(h200)->usage();
  CHECK(usage.device_total == 143771ull * MiB);
  CHECK(usage.device_used == 518 * MiB);
  // and bad items are refused naming them
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"context=5XB", "CACHEALLOC_SIMULATED: context='5XB' is not a size"},
           {"contxt=1GiB", "CACHEALLOC_SIMULATED: unknown key 'contxt'"},
           {"context", "CACHEALLOC_SIMULATED: 'context' is not key=value"},
           {"capacity=1GiB,context=2GiB", "exceed the capacity"},
           {"capacity=0", "capacity must be more than 0"},
           {"context=99999999999999999GiB", "is not a size"},
           {"other_processes=2GiB", "is not a count of processes"}}) {
    CAPTURE(text);
    try {
      (void)simulated_options_from_text(text);
      FAIL("accepted");
    } catch (const InvalidArgument& e) {
      CHECK(std::string(e.what()).find(message) != std::string::npos);
    }
  }
}
