// The in-memory model of a memory-history snapshot.
//
// This is the contract between the three halves of the product: the recorder
// fills it at dump time, the binary format (format.hpp) and the PyTorch pickle
// reader (pickle.hpp) serialize it, and the analyzer reads it. It holds raw
// facts only; every interpretation lives in analyzer/.
//
// Thread safety: plain values, no internal synchronization.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cachealloc/events.hpp"
#include "cachealloc/layout.hpp"

namespace cachealloc::snapshot {

// The allocator's vocabulary (events.hpp, layout.hpp), as the snapshot uses it.
using events::EventKind;
using events::kEventKindCount;
using events::parse_event_kind;
using events::SegmentFlags;
using events::segment_flag_expandable;
using events::segment_flag_large_pool;
using events::to_string;
using layout::Block;
using layout::BlockState;
using layout::Segment;
using layout::StackId;
using layout::to_string;

// Strong ids. 0 is reserved for "none" in StringId (and StackId, layout.hpp).
struct FrameId {
  std::uint32_t value = 0;
  friend bool operator==(FrameId, FrameId) = default;
  friend auto operator<=>(FrameId, FrameId) = default;
};
struct StringId {
  std::uint32_t value = 0;
  friend bool operator==(StringId, StringId) = default;
  friend auto operator<=>(StringId, StringId) = default;
  explicit operator bool() const { return value != 0; }
};

// One allocator event. `time_ns` is monotonic (CLOCK_MONOTONIC) and never
// decreases along the ring. `stream` is an opaque stream handle (0 = default).
struct Event {
  EventKind kind = EventKind::alloc;
  std::int32_t device = 0;
  std::uint32_t thread = 0;  // small thread index, see Snapshot::threads
  StackId stack{};
  std::uint64_t time_ns = 0;
  std::uint64_t stream = 0;
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t aux = 0;
  friend bool operator==(const Event&, const Event&) = default;
};

// A symbolized frame. Unresolved parts are empty strings / 0.
struct Frame {
  std::uint64_t ip = 0;     // raw return address as captured
  StringId function{};
  StringId file{};
  std::uint32_t line = 0;
  StringId module{};
  friend bool operator==(const Frame&, const Frame&) = default;
};

// A stack: frames innermost first.
struct Stack {
  std::vector<FrameId> frames;
  friend bool operator==(const Stack&, const Stack&) = default;
};

// Where a device's usage figures (what nvidia-smi shows) came from.
// Numeric values are part of the on-disk format: append only.
enum class UsageSource : std::uint8_t {
  not_recorded = 0,  // written before format version 5, or a PyTorch pickle
  nvml = 1,          // NVML (libnvidia-ml.so.1), read by the recorder
  simulated = 2,     // the simulated device's model of NVML
  unavailable = 3,   // the recorder tried and could not: DeviceInfo::usage_note says why
};
const char* to_string(UsageSource source) noexcept;

// Event index of a DeviceUsage read at the dump rather than at an event.
inline constexpr std::uint64_t kUsageAtDump = ~std::uint64_t{0};

// One reading of NVML, the source nvidia-smi prints: this process's memory
// (`nvidia-smi --query-compute-apps=pid,used_memory`) and the whole device's
// (`--query-gpu=memory.used,memory.total`), at the dump or at an OOM.
struct DeviceUsage {
  std::uint64_t event = kUsageAtDump;  // index into Snapshot::events of the OOM it was read at
  std::uint64_t time_ns = 0;           // CLOCK_MONOTONIC, as Event::time_ns
  bool process_found = false;          // this process was among the device's compute processes
  std::uint64_t process_used = 0;      // this process's device memory (valid when process_found)
  std::uint64_t device_used = 0;       // memory.used (NVML v2: excludes the driver's reservation)
  std::uint64_t device_reserved = 0;   // memory.reserved: held by the driver and firmware, 0 when not reported
  std::uint64_t device_total = 0;      // memory.total
  std::uint32_t other_processes = 0;   // other compute processes on the device
  std::uint64_t other_processes_used = 0;  // their device memory, summed
  friend bool operator==(const DeviceUsage&, const DeviceUsage&) = default;
};

struct DeviceInfo {
  std::int32_t index = 0;
  std::string name;                    // e.g. "NVIDIA H200" or "simulated"
  std::uint64_t total_bytes = 0;       // device capacity
  std::uint64_t driver_free_at_dump = 0;   // cudaMemGetInfo free at dump
  std::uint64_t driver_total_at_dump = 0;  // cudaMemGetInfo total at dump
  // Format version 5: NVML's view, at every OOM the ring still holds and at
  // the dump, in event order with the dump's reading last.
  UsageSource usage_source = UsageSource::not_recorded;
  std::string usage_note;  // nvml: "driver 580.95.05"; unavailable: why, e.g. "libnvidia-ml.so.1 not found"
  std::vector<DeviceUsage> usage;
  friend bool operator==(const DeviceInfo&, const DeviceInfo&) = default;
};

struct Header {
  std::uint32_t format_version = 0;  // filled by the writer/reader
  std::string writer_version;        // cachealloc version that wrote it
  std::string source;                // "cachealloc" or "pytorch-pickle"
  std::uint64_t dump_time_unix_ns = 0;
  std::string program;
  std::vector<std::string> arguments;
  std::int64_t pid = 0;
  std::string host;
  friend bool operator==(const Header&, const Header&) = default;
};

// The layout of one device just before events[0], for a ring that
// overflowed: what the lost events had built. A fact derived from the final
// layout and the events (derive_ring_start, ring_start.hpp), stored in the
// file (format version 4) so that a reader need not walk every event
// backwards to find it.
struct RingStart {
  std::int32_t device = 0;
  std::vector<Segment> segments;  // in address order, each with its blocks
  // Blocks alive at events[0] whose alloc was lost; known only from a later free.
  std::uint64_t blocks_from_before_ring = 0;
  // Blocks of the derivation that fell in no segment (a damaged trace).
  std::uint64_t unplaced_blocks = 0;
  // Free fragments of at most 1 MiB joined to the large-pool block before
  // them (the analyzer's derivation; never stored in a file).
  std::uint64_t joined_fragments = 0;
  friend bool operator==(const RingStart&, const RingStart&) = default;
};

struct Snapshot {
  Header header;
  std::vector<DeviceInfo> devices;
  // Allocator settings as key/value text, e.g. {"max_split_size_mb", "128"},
  // plus "config" holding the original CACHEALLOC_CONF string.
  std::map<std::string, std::string> settings;
  // Final stats, PyTorch's memory_stats() keys ("allocated_bytes.all.current"...).
  std::map<std::string, std::int64_t> stats;
  std::vector<Segment> segments;  // final layout, sorted by (device, address)
  std::vector<Event> events;      // the ring, oldest first
  std::uint64_t dropped_events = 0;  // events lost to ring overflow before events[0]
  // The layout at the ring's start, one entry per device, sorted by device.
  // Empty unless dropped_events > 0; encode() fills it in when the caller
  // left it empty (format.hpp). Readers trust it only as far as the events
  // confirm it.
  std::vector<RingStart> ring_start;
  // Tables. strings[0], frames[0] and stacks[0] are placeholders for "none".
  std::vector<std::string> strings{std::string()};
  std::vector<Frame> frames{Frame{}};
  std::vector<Stack> stacks{Stack{}};
  std::vector<std::uint64_t> threads;  // Event::thread -> OS thread id
  friend bool operator==(const Snapshot&, const Snapshot&) = default;
};

}  // namespace cachealloc::snapshot
