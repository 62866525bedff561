// follow_file: poll the size, read again when it grows, stop at the trailer.
#include "cachealloc/analyzer/follow.hpp"

#include <optional>
#include <system_error>
#include <thread>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/stream.hpp"

namespace cachealloc::analyzer {

namespace {

std::uintmax_t size_of(const std::filesystem::path& path) {
  std::error_code error;
  const std::uintmax_t size = std::filesystem::file_size(path, error);
  return error ? 0 : size;
}

// A path that exists but is no regular file (a directory, /dev/zero,
// /dev/null, a pipe) never grows by chunks: its size reads as 0 and the
// follow would wait forever. A path not there yet may still be created.
void refuse_unless_regular(const std::filesystem::path& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (!std::filesystem::exists(status) || std::filesystem::is_regular_file(status)) return;
  const char* what = std::filesystem::is_directory(status) ? "a directory" : "not a regular file";
  throw snapshot::SnapshotError(snapshot::ErrorCode::io, "--follow: " + path.string() + " is " + what +
                                                             ", not a recording that a writer appends to");
}

bool stopped(const FollowOptions& options) {
  return options.stop != nullptr && options.stop->load(std::memory_order_relaxed);
}

}  // namespace

bool recording_finished(const snapshot::Snapshot& head) {
  return head.header.format_version != snapshot::kStreamFormatVersion ||
         head.settings.count(snapshot::kStreamNoteSetting) == 0;
}

FollowEnd follow_file(const std::filesystem::path& path, const FollowOptions& options,
                      const std::function<void(FileEvents& source, bool finished)>& update) {
  std::uintmax_t seen_size = 0;
  std::size_t seen_events = 0;
  bool shown = false;
  for (;; std::this_thread::sleep_for(options.interval)) {
    if (stopped(options)) return FollowEnd::stopped;
    refuse_unless_regular(path);
    const std::uintmax_t size = size_of(path);
    if (size == 0 || (shown && size == seen_size)) continue;
    std::optional<FileEvents> read;
    try {
      read.emplace(path, options.decode_threads);
    } catch (const snapshot::SnapshotError& error) {
      // The writer has created the file but not finished its start chunk.
      if (!shown && error.code() == snapshot::ErrorCode::truncated) continue;
      throw;
    }
    FileEvents& source = *read;
    seen_size = size;
    const bool finished = recording_finished(source.head());
    // A chunk still being written reads as the chunks before it: nothing new.
    if (shown && !finished && source.event_count() == seen_events) continue;
    seen_events = source.event_count();
    shown = true;
    update(source, finished);
    if (finished) return FollowEnd::finished;
  }
}

}  // namespace cachealloc::analyzer
