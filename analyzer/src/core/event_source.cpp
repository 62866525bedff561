#include "cachealloc/analyzer/event_source.hpp"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>

#include "cachealloc/snapshot/detail/cores.hpp"

namespace cachealloc::analyzer {

// Blocks decoded ahead of the reader, in a ring of slots: block b lives in
// slot b % slots. Workers take the next block to decode in order, up to
// `slots - 1` past the one the reader holds, so the reader's block is never
// overwritten while it is in use.
class FileEvents::Prefetch {
 public:
  Prefetch(const std::filesystem::path& path, unsigned threads, std::size_t blocks)
      : blocks_(blocks), slots_(threads + 2) {
    for (Slot& slot : slots_) slot.block = kNone;
    // Fewer threads than asked (none to be had) only means less decoded ahead.
    for (unsigned t = 0; t < threads; ++t) {
      try {
        workers_.emplace_back([this, path] { work(path); });
      } catch (const std::system_error&) {
        break;
      }
    }
  }
  ~Prefetch() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }
  Prefetch(const Prefetch&) = delete;
  Prefetch& operator=(const Prefetch&) = delete;

  // Block `block`, the one after the last asked for (or the first); valid
  // until the next call.
  std::span<const snapshot::Event> take(std::size_t block) {
    std::unique_lock<std::mutex> lock(mutex_);
    reading_ = block;
    changed_.notify_all();
    Slot& slot = slots_[block % slots_.size()];
    changed_.wait(lock, [&] { return slot.block == block && slot.ready; });
    if (slot.error) std::rethrow_exception(slot.error);
    return slot.events;
  }
  // Whether take(block) is the next in order, which is all Prefetch serves,
  // and a thread is there to decode it.
  bool serves(std::size_t block) const noexcept { return block == next_in_order_ && !workers_.empty(); }
  void advance() noexcept { ++next_in_order_; }

 private:
  static constexpr std::size_t kNone = ~std::size_t{0};
  struct Slot {
    std::size_t block = kNone;
    bool ready = false;
    std::vector<snapshot::Event> events;
    std::exception_ptr error;
  };

  void work(const std::filesystem::path& path) {
    snapshot::SnapshotReader reader;
    std::exception_ptr open_error;
    try {
      reader.open(path);
    } catch (...) {
      open_error = std::current_exception();
    }
    std::vector<snapshot::Event> events;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      // The next block to decode, when it may go into its slot: no further
      // ahead of the reader than the ring allows.
      changed_.wait(lock, [&] {
        return stopping_ || (next_to_decode_ < blocks_ && next_to_decode_ < reading_ + slots_.size() - 1);
      });
      if (stopping_) return;
      const std::size_t block = next_to_decode_++;
      Slot& slot = slots_[block % slots_.size()];
      slot.block = block;
      slot.ready = false;
      std::swap(events, slot.events);  // decode outside the lock, into a vector of our own
      lock.unlock();
      std::exception_ptr error = open_error;
      if (!error) {
        try {
          reader.read_block(block, events);
        } catch (...) {
          error = std::current_exception();
        }
      }
      lock.lock();
      std::swap(events, slot.events);
      slot.error = error;
      slot.ready = true;
      changed_.notify_all();
    }
  }

  const std::size_t blocks_;
  std::vector<Slot> slots_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::size_t reading_ = 0;         // the block the reader holds or waits for
  std::size_t next_to_decode_ = 0;  // guarded by mutex_
  std::size_t next_in_order_ = 0;   // the reader's side only
  bool stopping_ = false;
};

FileEvents::FileEvents(const std::filesystem::path& path, unsigned decode_threads)
    : path_(path), reader_(path), decode_threads_(decode_threads) {}

FileEvents::~FileEvents() = default;

namespace {

// The events of a FileEvents that holds them all in memory, for another
// thread: SnapshotReader::loaded_block() only reads.
class LoadedEvents final : public EventSource {
 public:
  explicit LoadedEvents(const snapshot::SnapshotReader& reader) : reader_(reader) {}
  const snapshot::Snapshot& head() const override { return reader_.head(); }
  std::size_t event_count() const override { return static_cast<std::size_t>(reader_.event_count()); }
  std::size_t block_count() const override { return reader_.block_count(); }
  std::size_t block_begin(std::size_t block) const override {
    return static_cast<std::size_t>(reader_.block_first_event(block));
  }
  std::span<const snapshot::Event> block(std::size_t block) override { return reader_.loaded_block(block); }
  std::unique_ptr<EventSource> open_another() override { return std::make_unique<LoadedEvents>(reader_); }

 private:
  const snapshot::SnapshotReader& reader_;
};

}  // namespace

std::unique_ptr<EventSource> FileEvents::open_another() {
  if (!reader_.streaming()) return std::make_unique<LoadedEvents>(reader_);
  return std::unique_ptr<EventSource>(new FileEvents(*this, Sibling{}));
}

FileEvents::FileEvents(const FileEvents& other, Sibling) : path_(other.path_) { reader_.open_sibling(other.reader_); }

unsigned FileEvents::default_decode_threads() noexcept {
  const unsigned cores = snapshot::detail::usable_cores();
  return cores <= 1 ? 0 : std::min(cores - 1, 4u);
}

std::span<const snapshot::Event> FileEvents::block(std::size_t block) {
  if (!reader_.streaming()) return reader_.loaded_block(block);  // already in memory
  if (decode_threads_ > 0 && block < reader_.block_count()) {
    // A pass in order from the first block starts the decoders; a jump
    // elsewhere (the backward pass, a lookup) stops them.
    if (block == 0) {
      prefetch_.reset();
      prefetch_ = std::make_unique<Prefetch>(path_, decode_threads_, reader_.block_count());
    }
    if (prefetch_ && prefetch_->serves(block)) {
      prefetch_->advance();
      return prefetch_->take(block);
    }
    prefetch_.reset();
  }
  reader_.read_block(block, buffer_);
  return buffer_;
}

}  // namespace cachealloc::analyzer
