// Following a streamed recording while it is written (`summary --follow`,
// like tail -f): the file is read again each time new complete chunks have
// been appended, and the caller builds and prints its result from each read.
//
// Each read is a fresh FileEvents over the whole file, so a report over it
// costs what it costs over a finished file of that length; a stream without
// its trailer yet is read up to its last complete chunk (snapshot/stream.hpp).
//
// Thread safety: follow_file runs on the calling thread; `stop` may be set
// from any thread or a signal handler.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>

#include "cachealloc/analyzer/event_source.hpp"

namespace cachealloc::analyzer {

struct FollowOptions {
  // How often the file's size is looked at.
  std::chrono::milliseconds interval{1000};
  // Decoding threads of each read (FileEvents).
  unsigned decode_threads = 0;
  // When set (a SIGINT handler, a test), the follow ends at its next look.
  const std::atomic<bool>* stop = nullptr;
};

enum class FollowEnd : unsigned char {
  finished,  // the recording's trailer was read (or the file is not a stream: it never grows)
  stopped,   // *stop was set first
};

// True when `head` is a complete recording: any snapshot but a streamed one
// still missing its trailer.
bool recording_finished(const snapshot::Snapshot& head);

// Calls update(source, finished) with the file read afresh: at once (once
// the file holds a stream's start: a file not there yet, empty or cut short
// before its first read is waited for, as tail -F does), then each time
// it has grown by new complete events chunks or its trailer, until the
// trailer is read (the last call has finished == true) or *stop is set.
// Throws SnapshotError as FileEvents does (a file that is no snapshot is
// refused at its first read, once it holds enough bytes to tell), an io one
// as soon as the path exists but is no regular file (a directory, a device,
// a pipe: it never grows), and whatever update throws.
FollowEnd follow_file(const std::filesystem::path& path, const FollowOptions& options,
                      const std::function<void(FileEvents& source, bool finished)>& update);

}  // namespace cachealloc::analyzer
