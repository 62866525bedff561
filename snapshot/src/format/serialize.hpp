// cereal functions for the model (docs/FORMAT.md, "Body"). Private to the
// snapshot library: other formats (the PyTorch pickle reader) do not go
// through cereal.
//
// Every type carries a CEREAL_CLASS_VERSION, written once per type per file.
// To change a type's layout: bump kFormatVersion, bump the type's class
// version, and branch on `version` in its function so older files still load.
#pragma once

#include <cereal/cereal.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <cstdint>
#include <string>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/model.hpp"
#include "event_codec.hpp"

namespace cachealloc::snapshot::detail {
// The class version each type is written with. cereal's own registry is not
// constexpr, so this is the source of truth and CEREAL_CLASS_VERSION copies it.
// Bump a type's entry (a specialization) when its layout changes.
template <class T>
inline constexpr std::uint32_t kClassVersion = 1;
// 2 since format version 2, 3 since format version 6: the event encoding
// (event_codec.hpp).
template <>
inline constexpr std::uint32_t kClassVersion<EventColumns> = kEventEncoding;
// 2 since format version 5: NVML's usage readings follow the driver's figures.
template <>
inline constexpr std::uint32_t kClassVersion<DeviceInfo> = 2;
struct SnapshotHead;
// 2 since format version 4: the ring start follows the segments.
template <>
inline constexpr std::uint32_t kClassVersion<SnapshotHead> = 2;

// Everything of a Snapshot but its events: the head section of format
// version 3, whose events follow in blocks (docs/FORMAT.md, "Version 3").
// Holds a pointer so one type serves both directions; saving never writes
// through it.
struct SnapshotHead {
  Snapshot* snapshot;
  // Saving only: written in place of snapshot->ring_start when not null (the
  // writer derived it, format.cpp).
  const std::vector<RingStart>* ring_start = nullptr;
};
}  // namespace cachealloc::snapshot::detail

// Before any function below asks cereal for a version.
CEREAL_CLASS_VERSION(cachealloc::snapshot::StackId, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::StackId>)
CEREAL_CLASS_VERSION(cachealloc::snapshot::FrameId, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::FrameId>)
CEREAL_CLASS_VERSION(cachealloc::snapshot::StringId, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::StringId>)
CEREAL_CLASS_VERSION(cachealloc::snapshot::Header, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::Header>)
CEREAL_CLASS_VERSION(cachealloc::snapshot::DeviceInfo, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::DeviceInfo>)
CEREAL_CLASS_VERSION(cachealloc::snapshot::DeviceUsage, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::DeviceUsage>)
CEREAL_CLASS_VERSION(cachealloc::snapshot::Block, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::Block>)
CEREAL_CLASS_VERSION(cachealloc::snapshot::Segment, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::Segment>)
CEREAL_CLASS_VERSION(cachealloc::snapshot::RingStart, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::RingStart>)
CEREAL_CLASS_VERSION(cachealloc::snapshot::Frame, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::Frame>)
CEREAL_CLASS_VERSION(cachealloc::snapshot::Stack, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::Stack>)
CEREAL_CLASS_VERSION(cachealloc::snapshot::Snapshot, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::Snapshot>)
CEREAL_CLASS_VERSION(cachealloc::snapshot::detail::EventColumns, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::detail::EventColumns>)
CEREAL_CLASS_VERSION(cachealloc::snapshot::detail::SnapshotHead, cachealloc::snapshot::detail::kClassVersion<cachealloc::snapshot::detail::SnapshotHead>)


namespace cachealloc::snapshot {
namespace detail {

// A class version above ours can only come from a newer writer that forgot to
// bump kFormatVersion, or from corruption: refuse rather than misread.
template <class T>
void require_known_class_version(std::uint32_t version, const char* type_name) {
  constexpr std::uint32_t ours = kClassVersion<T>;
  if (version > ours) {
    throw SnapshotError(ErrorCode::inconsistent, std::string("inconsistent snapshot: ") + type_name +
                                                     " has class version " + std::to_string(version) +
                                                     ", this reader knows up to " + std::to_string(ours));
  }
}

template <class Archive>
void serialize(Archive& ar, EventColumns& columns, std::uint32_t version) {
  require_known_class_version<EventColumns>(version, "EventColumns");
  ar(columns.count, columns.flags, columns.context, columns.time, columns.address, columns.detail, columns.stack,
     columns.size, columns.aux);
  // The columns keep their layout; what the bytes in them mean depends on the
  // class version, so the decoder needs it.
  if constexpr (Archive::is_loading::value) columns.encoding = version;
}

}  // namespace detail
}  // namespace cachealloc::snapshot

// The allocator's layout types (cachealloc/layout.hpp) live in
// cachealloc::layout, where cereal finds their functions by argument lookup.
namespace cachealloc::layout {
template <class Archive>
void serialize(Archive& ar, StackId& id, std::uint32_t version) {
  snapshot::detail::require_known_class_version<StackId>(version, "StackId");
  ar(id.value);
}

// Enums travel as their underlying byte; validate() rejects unknown values.
template <class Archive>
void serialize(Archive& ar, Block& block, std::uint32_t version) {
  snapshot::detail::require_known_class_version<Block>(version, "Block");
  auto state = static_cast<std::uint8_t>(block.state);
  ar(block.address, block.size, block.requested, state, block.stack);
  block.state = static_cast<BlockState>(state);
}

template <class Archive>
void serialize(Archive& ar, Segment& segment, std::uint32_t version) {
  snapshot::detail::require_known_class_version<Segment>(version, "Segment");
  ar(segment.device, segment.stream, segment.address, segment.total_size, segment.large_pool, segment.expandable,
     segment.stack, segment.blocks);
}

}  // namespace cachealloc::layout

namespace cachealloc::snapshot {

template <class Archive>
void serialize(Archive& ar, FrameId& id, std::uint32_t version) {
  detail::require_known_class_version<FrameId>(version, "FrameId");
  ar(id.value);
}
template <class Archive>
void serialize(Archive& ar, StringId& id, std::uint32_t version) {
  detail::require_known_class_version<StringId>(version, "StringId");
  ar(id.value);
}

// Header::format_version is not stored here: the framing holds it, and the
// reader copies it in.
template <class Archive>
void serialize(Archive& ar, Header& header, std::uint32_t version) {
  detail::require_known_class_version<Header>(version, "Header");
  ar(header.writer_version, header.source, header.dump_time_unix_ns, header.program, header.arguments, header.pid,
     header.host);
}

template <class Archive>
void serialize(Archive& ar, DeviceInfo& device, std::uint32_t version) {
  detail::require_known_class_version<DeviceInfo>(version, "DeviceInfo");
  ar(device.index, device.name, device.total_bytes, device.driver_free_at_dump, device.driver_total_at_dump);
  if (version >= 2) {
    auto source = static_cast<std::uint8_t>(device.usage_source);
    ar(source, device.usage_note, device.usage);
    device.usage_source = static_cast<UsageSource>(source);
  }
}

template <class Archive>
void serialize(Archive& ar, DeviceUsage& usage, std::uint32_t version) {
  detail::require_known_class_version<DeviceUsage>(version, "DeviceUsage");
  ar(usage.event, usage.time_ns, usage.process_found, usage.process_used, usage.device_used, usage.device_reserved,
     usage.device_total, usage.other_processes, usage.other_processes_used);
}

template <class Archive>
void serialize(Archive& ar, RingStart& start, std::uint32_t version) {
  detail::require_known_class_version<RingStart>(version, "RingStart");
  ar(start.device, start.segments, start.blocks_from_before_ring, start.unplaced_blocks);
}

template <class Archive>
void serialize(Archive& ar, Frame& frame, std::uint32_t version) {
  detail::require_known_class_version<Frame>(version, "Frame");
  ar(frame.ip, frame.function, frame.file, frame.line, frame.module);
}

template <class Archive>
void serialize(Archive& ar, Stack& stack, std::uint32_t version) {
  detail::require_known_class_version<Stack>(version, "Stack");
  ar(stack.frames);
}

// Format versions 1 and 2 only (read, never written): the whole snapshot in
// one archive, the events last as one EventColumns. Version 3 writes a
// SnapshotHead and the events in blocks instead (format.cpp).
template <class Archive>
void load(Archive& ar, Snapshot& snapshot, std::uint32_t version) {
  detail::require_known_class_version<Snapshot>(version, "Snapshot");
  detail::EventColumns columns;
  ar(snapshot.header, snapshot.devices, snapshot.settings, snapshot.stats, snapshot.strings, snapshot.frames,
     snapshot.stacks, snapshot.threads, snapshot.segments, snapshot.dropped_events, columns);
  snapshot.events = detail::decode_events(columns);
}

namespace detail {
// Tables come before their users so a streaming reader resolves ids as it
// goes; the events follow the head in blocks of EventColumns. Class version
// 1 (format version 3) has no ring start; version 2 (format version 4) has
// it between the segments and dropped_events.
template <class Archive>
void serialize(Archive& ar, SnapshotHead& head, std::uint32_t version) {
  require_known_class_version<SnapshotHead>(version, "SnapshotHead");
  Snapshot& s = *head.snapshot;
  ar(s.header, s.devices, s.settings, s.stats, s.strings, s.frames, s.stacks, s.threads, s.segments);
  if (version >= 2) {
    if constexpr (Archive::is_loading::value) {
      ar(s.ring_start);
    } else {
      // Saving only reads through the reference.
      ar(const_cast<std::vector<RingStart>&>(head.ring_start != nullptr ? *head.ring_start : s.ring_start));
    }
  }
  ar(s.dropped_events);
}
}  // namespace detail

}  // namespace cachealloc::snapshot
