// The parts of a dump that a streamed recording writes too (history_dump.cpp):
// the header, the settings, text made valid UTF-8. Private to the recorder.
#pragma once

#include <map>
#include <string>

#include "cachealloc/config.hpp"
#include "cachealloc/device.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/model.hpp"

namespace cachealloc::detail {

// Writer version, source, wall-clock time now, command line, pid, host.
snapshot::Header history_header();
// The allocator's settings, the config text, the backend and the history options.
void history_settings(std::map<std::string, std::string>& settings, const AllocatorConfig& config,
                      const Device& device, const HistoryOptions& options);
// A driver/NVML reading as the snapshot keeps it (its event and time left
// for the caller).
snapshot::DeviceUsage usage_reading(const DeviceUsage& reading);
// Every string of the snapshot, each invalid byte as U+FFFD.
void make_history_text_valid(snapshot::Snapshot& snapshot);

}  // namespace cachealloc::detail
