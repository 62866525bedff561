// Reading and writing cachealloc's binary snapshot format (docs/FORMAT.md).
//
// Compatibility rule: a reader reads every format version up to its own
// kFormatVersion and rejects a newer one with SnapshotError{newer_version},
// whose message names both versions.
//
// Thread safety: every function is reentrant and may run concurrently; the only
// shared state is an atomic counter that keeps temporary file names unique.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::snapshot {

// Bumped on any change of the on-disk layout. 2: the event encoding codes
// stacks, times and cached blocks against predictions. 3: the events travel
// in blocks of 64 Ki that decode alone, after a head section holding
// everything else, so a reader can stream them (reader.hpp, docs/FORMAT.md).
// 4: the head holds the layout at the ring's start (Snapshot::ring_start)
// when the ring overflowed, so the analyzer skips its backward pass.
// 5: each device holds NVML's readings (DeviceInfo::usage), what nvidia-smi
// shows for this process and the whole device, at the dump and at OOMs.
// 6: event encoding 3, coded against the previous event and one earlier
// event named by its distance, with no predictor maps: cheaper to decode.
// 7: a streamed recording (stream.hpp): self-contained, checksummed,
// compressed chunks appended while the run goes on, the final layout in a
// trailer. A snapshot written whole is still version 6 (kWholeFormatVersion).
inline constexpr std::uint32_t kFormatVersion = 7;
// The version encode() and write_snapshot() write: a snapshot written whole.
inline constexpr std::uint32_t kWholeFormatVersion = 6;

enum class ErrorCode {
  not_a_snapshot,  // bad magic: "not a cachealloc snapshot"
  newer_version,   // written by a newer format version than we read
  truncated,       // the data ends early
  inconsistent,    // counts or references that do not add up
  io,              // the file could not be opened, read or written
  unsupported,     // a well-formed input this reader does not handle
};

// Every failure to read or write a snapshot. what() is one line, fit to print
// after "error: ".
class SnapshotError : public std::runtime_error {
 public:
  SnapshotError(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Checks every reference of `snapshot` against its tables: stack, frame and
// string ids (0 always means "none" for stacks and strings), event kinds,
// block states (of the final layout and of the ring start), ring starts in
// increasing device order, and Event::thread < threads.size() when threads
// is non-empty.
// Throws SnapshotError{inconsistent} naming the first bad reference.
void validate(const Snapshot& snapshot);

// Serializes `snapshot` into bytes. Throws SnapshotError{inconsistent} when the
// snapshot references a stack, frame or string that is not in its tables.
// When dropped_events > 0 and ring_start is empty, writes the ring start
// derive_ring_starts() finds (ring_start.hpp): one backward pass over the
// events per device, a few percent of the encoding's time. A ring_start the
// caller set is written as it is.
std::vector<std::byte> encode(const Snapshot& snapshot);

// Parses bytes produced by encode() of this or an older version, validates
// the result as validate() does, and sets header.format_version to the
// version the bytes were written with (encode() ignores that field, so
// decode(encode(s)) == s when s.header.format_version == kFormatVersion and
// s.ring_start is set or not needed: see encode()). Files before version 4
// have no ring start: it comes back empty.
// Throws SnapshotError with the matching ErrorCode. Hostile input costs at
// most time and memory linear in its size.
Snapshot decode(std::span<const std::byte> bytes);

// Writes what encode() writes atomically: a temporary file beside `path`, fsync, then rename, so a
// crash never leaves half a snapshot and never destroys an existing file at
// `path` unless the new one is complete. Throws SnapshotError{inconsistent}
// when validation fails, before touching the disk, and SnapshotError{io},
// naming the path and the system's reason, when the disk fails; either way
// no temporary file is left behind.
void write_snapshot(const Snapshot& snapshot, const std::filesystem::path& path);

// Reads a file written by write_snapshot, as decode() does. Throws
// SnapshotError{io} naming the path when it cannot be opened or read
// (missing, a directory, no permission).
Snapshot read_snapshot(const std::filesystem::path& path);

// True when `bytes` begin with our magic.
bool has_snapshot_magic(std::span<const std::byte> bytes) noexcept;

namespace detail {
// encode() without validate(): only for tests of the reader's rejections,
// which need files that the writer would refuse to produce.
std::vector<std::byte> encode_unvalidated(const Snapshot& snapshot);
// decode() without validate(): only for the codec's round trips of figures
// no recorder writes (times of 2^64 - 1, sizes past any device), which the
// readers refuse (invariants.hpp).
Snapshot decode_unvalidated(std::span<const std::byte> bytes);
// encode() as format version 5 (event encoding 2) or 6 (kWholeFormatVersion,
// event encoding 3), the two that share the head's layout: for the tests and
// the benchmark that compare the encodings (bench/analyze_throughput.cpp).
// Throws SnapshotError{inconsistent} for any other version.
std::vector<std::byte> encode_as_version(const Snapshot& snapshot, std::uint32_t format_version);
// Whether the event decoder (encoding 3) merges a varint's bytes with PEXT:
// on x86-64 where PEXT is fast (Intel with BMI2, AMD from Zen 3), chosen
// once at start. The events are the same either way. For the tests and the
// benchmark that compare the two merges on one machine:
// set_varint_pext(false) forces the portable merge; true takes effect only
// where PEXT is fast. Returns what is in use from then on.
bool varint_pext() noexcept;
bool set_varint_pext(bool on) noexcept;
}  // namespace detail

}  // namespace cachealloc::snapshot
