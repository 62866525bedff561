// Reading and writing the pickles of PyTorch's memory snapshots
// (`torch.cuda.memory._dump_snapshot`), without Python.
//
// The reader is a restricted unpickler: it understands the opcodes of
// protocols 2 to 5 that build plain data (dicts, lists, tuples, str, bytes,
// int of any length, float, bool, None, the memo and framing) and rejects
// every opcode that would import or call something (GLOBAL, STACK_GLOBAL,
// REDUCE, BUILD, NEWOBJ, INST, OBJ, EXT*, PERSID...) with
// SnapshotError{unsupported} naming the opcode. Nothing from the file is
// ever executed. docs/FORMAT.md ("PyTorch pickles") gives the mapping onto
// the model in both directions.
//
// Cost: one pass over the opcodes into a compact tree (pickle_value.hpp):
// 16 bytes per value held in a container, 16 per container, 4 per memo
// entry, strings viewed in the input (which the caller keeps alive), frame
// lists stored once per distinct content, and each trace entry packed into
// the Event it becomes, in place. PyTorch's trace entries, ~20 opcodes each,
// are read whole in one step; a long trace list is split at entry
// boundaries and read by one thread per core (up to 16), each chunk proved
// to start where the one before it ends, and the result is the one-thread
// result exactly (anything the threads cannot vouch for is read again on
// one thread). The mapping onto the model also runs on those threads. On a
// PyTorch trace of 3M entries (186 MB) the peak is ~3.4x the file, the file
// itself included; see docs/PERFORMANCE.md, "PyTorch pickles".
//
// Cost on hostile input: time and memory stay linear in the input size. The
// memo holds references, never copies, so a container referenced a million
// times costs a million references; the value stack is capped (deep nesting
// is rejected); every declared length is checked against the bytes left
// before anything is allocated; and the model built from the tree is capped
// at one segment, block or event per input byte.
//
// Thread safety: every function is reentrant and may run concurrently.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::snapshot {

// Header::source of every snapshot read from a PyTorch pickle.
inline constexpr const char* kPytorchPickleSource = "pytorch-pickle";

// Snapshot::settings key set to "true" for a pickle of the segments alone
// (pickle.dump(torch.cuda.memory_snapshot()), a list rather than a dict):
// the final layout, with no trace, no allocator settings and no stacks of
// freed memory. Reports say what that leaves out.
inline constexpr const char* kSegmentsOnlySetting = "pytorch_segments_only";

// Snapshot::settings key holding how many trace records the reader skipped
// (actions and annotation stages it does not know), when there were any.
// It describes the pickle read: our format keeps it, and a pickle written
// from the snapshot has no place for it (it is not an allocator setting),
// so pickle_conversion_losses() names it.
inline constexpr const char* kSkippedRecordsSetting = "pytorch_skipped_records";

// Snapshot::settings keys holding how many allocations' block sizes the
// reader inferred (the trace begins mid-run) or found contradicted by the
// final layout: the sum over the file under the key itself, and each
// device's under the key + "." + its index (files read since the per-device
// keys; each device's trace is sized on its own).
inline constexpr const char* kInferredBlockSizesSetting = "block_sizes.inferred";
inline constexpr const char* kContradictedBlockSizesSetting = "block_sizes.contradicted";

// The count under `key` (one of the two above) for `device`: its own key
// where the file has it, else the file's sum; 0 when absent or unreadable.
inline std::uint64_t block_size_count(const Snapshot& head, const char* key, std::int32_t device) {
  auto found = head.settings.find(std::string(key) + "." + std::to_string(device));
  if (found == head.settings.end()) found = head.settings.find(key);
  std::uint64_t count = 0;
  if (found != head.settings.end())
    std::from_chars(found->second.data(), found->second.data() + found->second.size(), count);
  return count;
}

// True when `bytes` start like a pickle this reader may read: the PROTO
// opcode (0x80) followed by a protocol from 2 to 5.
bool has_pickle_header(std::span<const std::byte> bytes) noexcept;

// Parses a PyTorch memory snapshot pickle and maps it onto the model.
// The result passes validate(). Errors (SnapshotError):
//   not_a_snapshot  not a pickle of protocol 2+, or the pickle is neither a
//                   dict with 'segments' / 'device_traces' nor a list of
//                   segments (kSegmentsOnlySetting)
//   newer_version   a pickle protocol above 5
//   truncated       the data ends before STOP or inside an argument
//   unsupported     an opcode that would execute code, or one this reader
//                   does not implement; the message names it and its offset
//   inconsistent    a bad memo index, a mark missing, an opcode applied to the
//                   wrong type, nesting past the limit, a field of the wrong
//                   type, an integer out of range, an unknown block state
Snapshot decode_pytorch_pickle(std::span<const std::byte> bytes);

// Reads the whole file, then decode_pytorch_pickle(). SnapshotError{io}
// naming the path when it cannot be opened or read.
Snapshot read_pytorch_pickle(const std::filesystem::path& path);

// Serializes `snapshot` the way `_dump_snapshot` does (protocol 4, only the
// opcodes the reader accepts), for PyTorch's viewer and for pickle.load.
// Events with no PyTorch action (split, merge, empty_cache) are left out;
// annotation events go to 'external_annotations'. Throws
// SnapshotError{inconsistent} when validate() fails.
std::vector<std::byte> encode_pytorch_pickle(const Snapshot& snapshot);

namespace detail {
// encode_pytorch_pickle without validate(): for tests that need a pickle
// PyTorch could write but our model refuses (times that step back, which
// the reader raises), as decode_unvalidated does for our format.
std::vector<std::byte> encode_pytorch_pickle_unvalidated(const Snapshot& snapshot);
}  // namespace detail

// What encode_pytorch_pickle() leaves out of `snapshot`, one phrase each
// ("12 split events", "the program's name, arguments, pid and host"), empty
// when nothing is lost. For converters to say so.
std::vector<std::string> pickle_conversion_losses(const Snapshot& snapshot);

// encode_pytorch_pickle() written atomically (temporary file beside `path`,
// fsync, rename). SnapshotError{io} naming the path when the disk fails; no
// temporary file is left behind.
void write_pytorch_pickle(const Snapshot& snapshot, const std::filesystem::path& path);

namespace detail {
// How the reader goes about a pickle. The snapshot is the same whatever
// they are (tests hold the reader to that); they exist for those tests and
// for benchmarks.
// What a read did, for tests that must know a path was taken.
struct PickleReadStats {
  std::uint64_t entries_read_whole = 0;  // trace entries read in one step on the calling thread
  std::uint64_t entries_read_in_parallel = 0;
  std::uint64_t chunks = 0;            // chunks read side by side and kept, over all parallel runs
  std::uint64_t parallel_restarts = 0;  // parallel reads abandoned for a one-thread read
  std::uint64_t parallel_tries = 0;     // parallel reads started, kept or not
  std::uint64_t block_sizes_per_segment = 0;  // devices whose block sizes the per-segment pass gave, on threads
};
struct PickleReadOptions {
  // Read each of PyTorch's trace entries whole, in one step, rather than one
  // opcode at a time.
  bool whole_entries = true;
  // Threads reading a long trace list side by side: 0 picks one per core (at
  // most 16), 1 reads everything on the calling thread.
  unsigned threads = 0;
  // The least bytes of trace each thread should get for threads to start.
  std::size_t min_chunk_bytes = std::size_t{4} << 20;
  // The fewest events of a device's trace for its block sizes to be inferred
  // per segment, on threads.
  std::size_t min_parallel_sizing_events = std::size_t{1} << 16;
  // Filled when set.
  PickleReadStats* stats = nullptr;
};
Snapshot decode_pytorch_pickle(std::span<const std::byte> bytes, const PickleReadOptions& options);

// PyTorch's CUDACachingAllocator round_size(): the block size it carves for a
// request of `requested` bytes. `divisions_by_interval[i]` is the
// roundup_power2_divisions setting for sizes in [2^i MiB, 2^(i+1) MiB)
// (index 0 also covers everything below 1 MiB, index 15 everything above).
std::uint64_t pytorch_round_size(std::uint64_t requested,
                                 std::span<const std::uint64_t, 16> divisions_by_interval) noexcept;
}  // namespace detail

}  // namespace cachealloc::snapshot
