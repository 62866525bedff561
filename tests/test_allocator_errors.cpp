// Bad input: configuration strings, impossible sizes, bad frees. Each gets a
// clear error and leaves the pools as they were.
#include <doctest/doctest.h>

#include <limits>

#include "allocator_support.hpp"

using namespace cachealloc;
using namespace test_support;

namespace {
std::string config_error(const std::string& text) {
  try {
    (void)parse_config(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a PyTorch-syntax config string sets every option") {
  const auto config = parse_config(
      "max_split_size_mb:128, roundup_power2_divisions:4,garbage_collection_threshold:0.6,expandable_segments:False");
  CHECK(config.max_split_size == 128 * MiB);
  CHECK(config.roundup_power2_divisions[0] == 4);
  CHECK(config.roundup_power2_divisions[15] == 4);
  CHECK(config.garbage_collection_threshold == doctest::Approx(0.6));
  CHECK_FALSE(config.expandable_segments);
  CHECK(parse_config("") == AllocatorConfig{.source = ""});
}

TEST_CASE("an unknown config key is an error that names it") {
  CHECK(config_error("max_split_size:128").find("'max_split_size:128'") != std::string::npos);
  CHECK(config_error("max_split_size:128").find("unknown option") != std::string::npos);
}

TEST_CASE("bad config values are errors that name the key") {
  CHECK(config_error("max_split_size_mb:abc").find("max_split_size_mb") != std::string::npos);
  CHECK(config_error("max_split_size_mb:20").find("greater than 20") != std::string::npos);
  CHECK(config_error("max_split_size_mb:-5").find("max_split_size_mb") != std::string::npos);
  CHECK(config_error("garbage_collection_threshold:1.5").find("garbage_collection_threshold") != std::string::npos);
  CHECK(config_error("garbage_collection_threshold:0").find("between") != std::string::npos);
  CHECK(config_error("roundup_power2_divisions:3").find("power of two") != std::string::npos);
  CHECK(config_error("roundup_power2_divisions:[3:2]").find("powers of two") != std::string::npos);
  CHECK(config_error("expandable_segments:yes").find("True or False") != std::string::npos);
  CHECK(config_error("max_split_size_mb").find("key:value") != std::string::npos);
  CHECK(config_error("backend:cudaMallocAsync").find("native") != std::string::npos);
}

TEST_CASE("CACHEALLOC_DEVICE accepts auto, cuda and simulated only") {
  CHECK(parse_device_choice("simulated") == DeviceChoice::simulated);
  CHECK(parse_device_choice("auto") == DeviceChoice::automatic);
  CHECK_THROWS_WITH_AS(parse_device_choice("gpu"), doctest::Contains("'gpu'"), InvalidArgument);
}

TEST_CASE("a request of zero bytes is an error") {
  CachingAllocator allocator(test_device());
  CHECK_THROWS_AS((void)allocator.allocate(0), InvalidArgument);
  CHECK(allocator.memory_reserved() == 0);
}

TEST_CASE("a negative size cast to size_t is an error, not an OOM") {
  CachingAllocator allocator(test_device());
  CHECK_THROWS_WITH_AS((void)allocator.allocate(static_cast<std::size_t>(-1)), doctest::Contains("larger than any device"),
                       InvalidArgument);
  CHECK_THROWS_AS((void)allocator.allocate(static_cast<std::size_t>(-4096)), InvalidArgument);
  CHECK(allocator.stats().num_ooms == 0);
}

TEST_CASE("a size larger than the device is an OOM and leaves the pools intact") {
  CachingAllocator allocator(test_device());
  void* a = allocator.allocate(MiB);
  CHECK_THROWS_AS((void)allocator.allocate(std::size_t{1} << 50), OutOfMemoryError);
  CHECK(allocator.memory_allocated() == MiB);
  allocator.deallocate(a);
  void* b = allocator.allocate(MiB);
  CHECK(b == a);
  allocator.deallocate(b);
}

TEST_CASE("a double free is reported and does not corrupt the pools") {
  CachingAllocator allocator(test_device());
  void* a = allocator.allocate(3 * MiB);
  void* keep = allocator.allocate(3 * MiB);
  CHECK(allocator.deallocate(a) == FreeStatus::ok);
  CHECK(allocator.deallocate(a) == FreeStatus::double_free);
  const auto stats = allocator.stats();
  CHECK(stats.allocation[stat_all].current == 1);
  CHECK(stats.allocated_bytes[stat_all].current == static_cast<std::int64_t>(3 * MiB));
  void* b = allocator.allocate(3 * MiB);
  void* c = allocator.allocate(3 * MiB);
  CHECK(b != c);  // the block was cached once, not twice
  for (void* p : {keep, b, c}) CHECK(allocator.deallocate(p) == FreeStatus::ok);
}

TEST_CASE("freeing a pointer we never returned is reported and changes nothing") {
  CachingAllocator allocator(test_device());
  void* a = allocator.allocate(3 * MiB);
  int local = 0;
  CHECK(allocator.deallocate(&local) == FreeStatus::unknown_pointer);
  CHECK(allocator.deallocate(static_cast<char*>(a) + 512) == FreeStatus::unknown_pointer);
  CHECK(allocator.deallocate(nullptr) == FreeStatus::null_pointer);
  CHECK(allocator.memory_allocated() == 3 * MiB);
  CHECK(allocator.deallocate(a) == FreeStatus::ok);
}

TEST_CASE("record_stream of a pointer that is not live is an error") {
  auto device = test_device();
  CachingAllocator allocator(device);
  int local = 0;
  CHECK_THROWS_AS(allocator.record_stream(&local, Stream{}), InvalidArgument);
}

TEST_CASE("a memory fraction outside [0, 1] is an error") {
  CachingAllocator allocator(test_device());
  CHECK_THROWS_AS(allocator.set_memory_fraction(1.5), InvalidArgument);
  CHECK_THROWS_AS(allocator.set_memory_fraction(-0.1), InvalidArgument);
  CHECK_THROWS_AS(allocator.set_memory_fraction(std::numeric_limits<double>::quiet_NaN()), InvalidArgument);
  CHECK(allocator.memory_cap() == 0);
}

TEST_CASE("without a CUDA device the cuda backend says so cleanly") {
  if (cuda_device_count() > 0) return;  // only meaningful where there is no GPU
  CHECK_THROWS_WITH_AS((void)make_cuda_device(0), doctest::Contains("no CUDA device"), DeviceError);
}

TEST_CASE("memory_stats' max_split_size is the setting in bytes, and -1 without a limit (PyTorch casts its size_t)") {
  auto device = test_support::simulated();
  CHECK(CachingAllocator(device).stats().max_split_size == -1);
  CHECK(CachingAllocator(device).stats().to_map().at("max_split_size") == -1);
  CHECK(CachingAllocator(device, parse_config("max_split_size_mb:128")).stats().max_split_size ==
        static_cast<std::int64_t>(128 * MiB));
}
