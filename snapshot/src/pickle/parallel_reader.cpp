// A long trace list read on several threads: its bytes split into chunks at
// entry starts, each chunk read on a thread of its own (ChunkReader), and the
// chunks that join up folded into the unpickler's tree, memo and stack.
#include <string.h>  // memmem

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "unpickler.hpp"

namespace cachealloc::snapshot::pickle {
namespace {

// Where one chunk's entries go in the tree: after those of the chunks
// before it.
struct ChunkBase {
  std::size_t containers = 0;
  std::size_t records = 0;
  std::size_t memo = 0;
  std::size_t boxes = 0;
  std::vector<std::uint64_t> frame_lists;  // the chunk's FrameList numbers -> the tree's
};

// The tree's arrays, as chunk writers fill them side by side: each writes
// only its own slots, sized before any starts.
struct TreeSlots {
  Container* containers = nullptr;
  Event* records = nullptr;
  std::uint32_t* entry_frames = nullptr;
  MemoEntry* memo = nullptr;
  Value* boxed = nullptr;
};

// One thread's share of a long trace list: the bytes [begin, stop), taking
// only whole entries, MARK, APPENDS and FRAME; reading stops at anything
// else, or at the first opcode boundary at or past stop. Read twice: count()
// learns how many containers, records, memo entries and boxes the chunk
// adds (and interns its frame lists), so every chunk's place in the tree is
// known; write() then reads it again straight into those places. Reading
// twice costs less than faulting in and copying a second set of arrays.
struct ChunkReader {
  std::size_t begin = 0;
  std::size_t stop = 0;
  std::size_t end = 0;  // where reading stopped
  bool failed = false;  // an exception left the chunk half read
  // Batches (MARK entries... APPENDS): whether the chunk ends inside one,
  // and how many of its entries come after its last APPENDS.
  bool open_at_end = true;
  bool has_appends = false;
  std::size_t entries_after_appends = 0;
  // What count() found; write() must find the same.
  std::size_t records = 0;
  std::size_t memo = 0;
  std::size_t boxes = 0;
  std::vector<FrameList> frame_lists;  // the chunk's numbers, frame dicts by the tree's ids
  std::vector<ContainerId> frame_items;
  FrameListTable frame_table;
  // References into earlier chunks' memo entries, followed once all are written.
  struct Fixup {
    std::size_t record;
    DeferredRef ref;
  };
  std::vector<Fixup> fixups;

  // Walks the chunk, calling on_entry(entry) for each whole entry; returns
  // where it stopped.
  template <class OnEntry>
  std::size_t walk(const std::uint8_t* data, std::size_t size, const MemoView& memo_view, OnEntry&& on_entry) {
    EntryScanner scanner;
    ScannedEntry entry;
    std::size_t at = begin;
    bool open = true;          // every chunk starts inside a batch
    std::size_t in_batch = 0;  // entries since the batch's MARK, as far as this chunk saw
    has_appends = false;
    entries_after_appends = 0;
    while (at < stop && at < size) {
      const std::uint8_t op = data[at];
      if (op == 0x7d) {  // EMPTY_DICT: a trace entry, whole, or stop
        std::size_t next = at + 1;
        if (!open || !scanner.scan(data, next, size, memo_view, true, entry)) break;
        on_entry(entry);
        ++in_batch;
        ++entries_after_appends;
        at = next;
      } else if (op == 0x65) {  // APPENDS
        if (!open || in_batch == 0) break;
        open = false;
        has_appends = true;
        entries_after_appends = 0;
        ++at;
      } else if (op == 0x28) {  // MARK
        if (open) break;
        open = true;
        in_batch = 0;
        ++at;
      } else if (op == 0x95) {  // FRAME
        if (size - at < 9) break;
        std::uint64_t length = 0;
        std::memcpy(&length, data + at + 1, 8);
        if (length > size - at - 9) break;
        at += 9;
      } else {
        break;
      }
    }
    open_at_end = open;
    return at;
  }

  std::uint64_t intern(const ScannedEntry& entry) {
    return frame_table.intern(std::span<const ContainerId>(entry.frames, entry.frame_count), frame_lists, frame_items);
  }

  void count(const std::uint8_t* data, std::size_t size, const MemoView& memo_view) {
    const char* last_text = nullptr;  // box_text()'s test, within the chunk
    std::uint32_t last_length = 0;
    end = walk(data, size, memo_view, [&](const ScannedEntry& entry) {
      ++records;  // its dict and frames list are not stored (kWholeEntryDict)
      memo += entry.memoized_count;
      for (std::size_t i = 0; i < entry.memoized_count; ++i) {
        if (entry.memoized[i] == ScannedEntry::Memoized::frames) {
          if (entry.frame_count != 0) intern(entry);
        } else if (entry.memoized[i] == ScannedEntry::Memoized::text) {
          if (!same_text(last_text, last_length, entry.text[i], entry.text_length[i])) {
            ++boxes;
            last_text = entry.text[i];
            last_length = entry.text_length[i];
          }
        }
      }
    });
  }

  // Returns false when the second reading differs from the first (it cannot,
  // short of a bug: the bytes are the same).
  bool write(const std::uint8_t* data, std::size_t size, const MemoView& memo_view, const ChunkBase& base,
             const TreeSlots& tree) {
    std::size_t record_index = base.records;
    std::size_t memo_index = base.memo;
    std::size_t box = base.boxes;
    const char* last_text = nullptr;
    std::uint32_t last_length = 0;
    bool same = true;
    const std::size_t stopped = walk(data, size, memo_view, [&](const ScannedEntry& entry) {
      if (record_index == base.records + records) {
        same = false;
        return;
      }
      const std::size_t memo_start = memo_index;
      const auto entry_index = static_cast<ContainerId>(record_index);
      const ContainerId dict = kWholeEntryDict | entry_index;
      Event record = entry.record;
      tree.entry_frames[record_index] = 0;
      for (std::size_t i = 0; i < entry.memoized_count; ++i) {
        MemoEntry stored = 0;
        switch (entry.memoized[i]) {
          case ScannedEntry::Memoized::dict: stored = (memo_kind_bits(Kind::dict) << kMemoKindShift) | dict; break;
          case ScannedEntry::Memoized::text:
            if (!same_text(last_text, last_length, entry.text[i], entry.text_length[i])) {
              Value value;
              value.kind = Kind::text;
              value.text = entry.text[i];
              value.length = entry.text_length[i];
              tree.boxed[box++] = value;
              last_text = entry.text[i];
              last_length = entry.text_length[i];
            }
            stored = static_cast<MemoEntry>(box - 1);
            break;
          case ScannedEntry::Memoized::frames: {
            const ContainerId list = kWholeEntryFrames | entry_index;
            if (entry.frame_count != 0) {
              tree.entry_frames[record_index] = static_cast<std::uint32_t>(base.frame_lists[intern(entry)] + 1);
            }
            record.thread = list;
            stored = (memo_kind_bits(Kind::list) << kMemoKindShift) | list;
            break;
          }
        }
        tree.memo[memo_index++] = stored;
      }
      record.stack = StackId{dict};
      // References past the memo as the chunks started: into this chunk's
      // own entries, follow them now; into an earlier chunk's, after all
      // chunks are written.
      for (std::size_t i = 0; i < entry.deferred_count; ++i) {
        const DeferredRef& ref = entry.deferred[i];
        if (ref.index >= memo_start + ref.memoized_before) {
          same = false;  // never stored by then: the one-by-one reader says what is wrong
        } else if (ref.index < base.memo) {
          fixups.push_back(Fixup{record_index, ref});
        } else if (!follow(ref, tree.memo[ref.index], tree.boxed, record)) {
          same = false;
        }
      }
      tree.records[record_index++] = record;
    });
    return same && stopped == end && record_index == base.records + records &&
           memo_index == base.memo + memo && box == base.boxes + boxes;
  }

  // What a deferred reference means to its record; false when the one-by-one
  // reader would not have made the dict a TraceEntry.
  static bool follow(const DeferredRef& ref, MemoEntry entry, const Value* boxed, Event& record) {
    switch (ref.use) {
      case DeferredRef::Use::action: {
        if ((entry >> kMemoKindShift) != 0 || boxed[entry].kind != Kind::text) return false;
        const std::optional<EventKind> action = trace_action_of(boxed[entry].view());
        if (!action) return false;
        record.kind = *action;
        return true;
      }
      case DeferredRef::Use::frames: {
        const Kind kind = memo_kind(entry);
        if (kind != Kind::list && kind != Kind::tuple) return false;
        record.thread = entry & kMemoIndexMask;
        return true;
      }
      case DeferredRef::Use::any: return true;
    }
    return false;
  }
};

// One chunk per thread over the bytes [first, size), each starting at the
// first entry (the bytes `entry_start`) at or after an even share of them.
std::vector<ChunkReader> split_into_chunks(const std::uint8_t* data, std::size_t size, std::size_t first,
                                           std::size_t threads, std::span<const std::uint8_t> entry_start) {
  std::vector<std::size_t> starts{first};
  for (std::size_t k = 1; k < threads; ++k) {
    const std::size_t from = first + (size - first) / threads * k;
    if (from <= starts.back()) continue;
    const void* found = ::memmem(data + from, size - from, entry_start.data(), entry_start.size());
    if (found == nullptr) break;
    const auto at = static_cast<std::size_t>(static_cast<const std::uint8_t*>(found) - data);
    if (at > starts.back()) starts.push_back(at);
  }
  std::vector<ChunkReader> chunks(starts.size());
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    chunks[k].begin = starts[k];
    chunks[k].stop = k + 1 < starts.size() ? starts[k + 1] : size;
  }
  return chunks;
}

// Runs step(k) for every chunk, one thread each, and `meanwhile` on this
// thread (or chunk 0's step when there is nothing else to do), and waits.
template <class Step, class Meanwhile>
void each_chunk(std::vector<ChunkReader>& chunks, std::size_t count, Step step, Meanwhile meanwhile) {
  std::vector<std::thread> workers;
  constexpr bool kMeanwhile = !std::is_same_v<Meanwhile, std::nullptr_t>;
  for (std::size_t k = kMeanwhile ? 0 : 1; k < count; ++k) {
    auto run = [&, k] {
      try {
        step(k);
      } catch (...) {  // out of memory: the one-thread read will say so
        chunks[k].failed = true;
      }
    };
    try {
      workers.emplace_back(run);
    } catch (const std::system_error&) {
      run();  // no thread to be had: this one does it
    }
  }
  if constexpr (kMeanwhile) {
    meanwhile();
  } else {
    try {
      step(0);
    } catch (...) {
      chunks[0].failed = true;
    }
  }
  for (std::thread& worker : workers) worker.join();
}

// The run of chunks that join up: chunk k must stop exactly where chunk
// k + 1 starts (proving that start an opcode boundary) and inside a batch
// (chunk k + 1 starts with an entry). The first that does not is kept
// too (it started at a boundary and stopped at one) and ends the run.
std::size_t joined_chunks(const std::vector<ChunkReader>& chunks) {
  std::size_t kept = 0;
  while (kept < chunks.size()) {
    const ChunkReader& chunk = chunks[kept++];
    if (chunk.failed) throw ParallelReadAbandoned{};
    if (chunk.end != chunk.stop || !chunk.open_at_end) break;
  }
  return kept;
}

// The bytes the chunks past the first `kept` counted for nothing.
std::size_t bytes_counted_in_vain(const std::vector<ChunkReader>& chunks, std::size_t kept) {
  std::size_t wasted = 0;
  for (std::size_t k = kept; k < chunks.size(); ++k) {
    if (chunks[k].end > chunks[k].begin) wasted += chunks[k].end - chunks[k].begin;
  }
  return wasted;
}

}  // namespace

// Called at the MARK that opens a batch of a trace list (the list is on the
// stack, its TraceRun ends at the last TraceEntry). Splits the bytes left
// into one chunk per thread, each starting at an entry (found by the bytes
// the last entry started with), reads the chunks side by side, and keeps
// the run of chunks that join up: chunk k must stop exactly where chunk
// k + 1 starts, which proves that start an opcode boundary. The tree, the
// memo and the stack then stand as after reading those bytes one opcode at
// a time, and reading goes on from where the last kept chunk stopped.
void Unpickler::read_trace_in_parallel() {
  if (!memo_dense_ || entry_start_length_ == 0 || !options_.whole_entries) return;
  const auto* data = reinterpret_cast<const std::uint8_t*>(bytes_.data());
  const std::size_t size = bytes_.size();
  const std::size_t first = position_;
  const std::size_t threads =
      std::min<std::size_t>(options_.threads, std::max<std::size_t>(1, (size - first) / options_.min_chunk_bytes));
  if (threads < 2) return;
  if (options_.stats != nullptr) ++options_.stats->parallel_tries;

  std::vector<ChunkReader> chunks = split_into_chunks(
      data, size, first, threads, std::span<const std::uint8_t>(entry_start_.data(), entry_start_length_));
  // The count pass's view. The presizing below stays within the vectors'
  // capacity, so these pointers hold until the resizes before the write
  // pass, which takes a fresh view (a view never outlives a reallocation).
  const MemoView counting_memo = memo_view();

  // Count; meanwhile, size the tree's arrays to all the room they reserved
  // (constructing and faulting in ~300 MB is a sequential cost as long as
  // the counting), cut to size once the counts are known.
  const ChunkBase start{tree_.containers.size(), tree_.traces.size(), memo_count_, boxed_.size(), {}};
  const std::size_t memo_entries = memo_.size();
  struct Restore {  // unless the chunks are kept
    Unpickler& self;
    ChunkBase start;
    std::size_t memo_entries;
    bool done = false;
    ~Restore() {
      if (done) return;
      self.tree_.containers.resize(start.containers);
      self.tree_.traces.resize(start.records);
      self.tree_.entry_frames.resize(start.records);
      self.memo_.resize(memo_entries);
    }
  } restore{*this, start, memo_entries};
  each_chunk(
      chunks, chunks.size(), [&](std::size_t k) { chunks[k].count(data, size, counting_memo); },
      [&] {
        // PyTorch's entries take ~62 bytes, with two containers and three
        // memo entries each; a little over that, within the room reserved.
        if (presized_) return;
        presized_ = true;
        const std::size_t entries = (size - first) / 56;
        auto presize = [](auto& vector, std::size_t wanted, const auto&... fill) {
          vector.resize(std::max(vector.size(), std::min(vector.capacity(), wanted)), fill...);
        };
        presize(tree_.traces, start.records + entries);
        presize(tree_.entry_frames, start.records + entries);
        presize(memo_, std::size_t{start.memo} + 3 * entries, kUnsetMemo);
      });
  const std::size_t kept = joined_chunks(chunks);
  // A short try (chunks thrown away, or nothing read): back off by the
  // bytes it counted in vain, and by a chunk's worth at least.
  if (kept < chunks.size() || chunks[0].records == 0) {
    next_parallel_at_ = chunks[kept - 1].end + std::max(bytes_counted_in_vain(chunks, kept), options_.min_chunk_bytes);
  }
  chunks.resize(kept);
  if (chunks.size() == 1 && chunks[0].records == 0) return;

  // Each chunk's place in the tree.
  std::vector<ChunkBase> bases(chunks.size());
  ChunkBase next{start.containers, start.records, start.memo, start.boxes, {}};
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    const ChunkReader& chunk = chunks[k];
    bases[k] = ChunkBase{next.containers, next.records, next.memo, next.boxes, {}};
    for (const FrameList& list : chunk.frame_lists) {
      bases[k].frame_lists.push_back(intern_frame_list(
          std::span<const ContainerId>(chunk.frame_items.data() + list.offset, list.size)));
    }
    next.records += chunk.records;
    next.memo += chunk.memo;
    next.boxes += chunk.boxes;
  }
  if (next.containers > kMaxStoredContainers || next.boxes > kMaxContainers || next.memo > size ||
      next.records > std::size_t{kWholeEntryIndexMask} + 1) {
    throw ParallelReadAbandoned{};
  }
  tree_.containers.resize(next.containers);
  tree_.traces.resize(next.records);
  tree_.entry_frames.resize(next.records);
  // The memo keeps all its room: cut to the chunks alone, the next MEMOIZE
  // would double it, copying ~40 MB.
  if (memo_.size() < next.memo) memo_.resize(next.memo, kUnsetMemo);
  boxed_.resize(next.boxes);
  restore.done = true;

  // Write, side by side; then follow the references into earlier chunks.
  // The resizes above may have moved memo_, boxed_ and the containers.
  const MemoView memo = memo_view();
  const TreeSlots slots{tree_.containers.data(), tree_.traces.data(), tree_.entry_frames.data(), memo_.data(),
                        boxed_.data()};
  std::vector<std::uint8_t> written(chunks.size(), 0);
  each_chunk(
      chunks, chunks.size(),
      [&](std::size_t k) { written[k] = chunks[k].write(data, size, memo, bases[k], slots); }, nullptr);
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    if (chunks[k].failed || written[k] == 0) throw ParallelReadAbandoned{};
    for (const ChunkReader::Fixup& fixup : chunks[k].fixups) {
      if (!ChunkReader::follow(fixup.ref, memo_[fixup.ref.index], boxed_.data(), tree_.traces[fixup.record])) {
        throw ParallelReadAbandoned{};
      }
    }
  }

  // The stack, the marks and the trace list, as the batches left them.
  memo_count_ = static_cast<std::uint32_t>(next.memo);
  const ContainerId list = stack_.back().container();
  std::size_t open_batch = 0;
  bool any_appends = false;
  for (const ChunkReader& chunk : chunks) {
    open_batch = chunk.has_appends ? chunk.entries_after_appends : open_batch + chunk.records;
    any_appends = any_appends || chunk.has_appends;
  }
  const std::size_t added = next.records - bases[0].records;
  if (!any_appends) open_batch = added;
  const std::size_t closed = added - open_batch;
  Container& run = changeable(list);
  if (run.size + closed > std::numeric_limits<std::uint32_t>::max()) throw ParallelReadAbandoned{};
  run.size += static_cast<std::uint32_t>(closed);
  if (chunks.back().open_at_end) {
    for (std::size_t r = next.records - open_batch; r < next.records; ++r) push_container(tree_.traces[r].stack.value);
  } else {
    marks_.pop_back();
  }
  position_ = chunks.back().end;
  if (options_.stats != nullptr) {
    options_.stats->entries_read_in_parallel += added;
    options_.stats->chunks += chunks.size();
  }
}

}  // namespace cachealloc::snapshot::pickle
