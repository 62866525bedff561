// The cereal archives of the snapshot body (docs/FORMAT.md, "Body").
//
// Why not cereal::BinaryInputArchive: it trusts every length it reads and
// resizes a vector or string to it before reading the elements, so eight
// corrupt bytes can ask for exabytes. These archives differ in three ways:
//  - a size tag is a varint and must not exceed the bytes left in the body.
//    Every element of every type we store takes at least one byte, so no
//    container can grow past (element size) x (input size);
//  - integers are little-endian whatever the host, so files move between hosts;
//  - running off the end throws SnapshotError{truncated}, never cereal::Exception.
#pragma once

#include <cereal/cereal.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "cachealloc/snapshot/format.hpp"

namespace cachealloc::snapshot::detail {

class LittleEndianOutputArchive
    : public cereal::OutputArchive<LittleEndianOutputArchive, cereal::AllowEmptyClassElision> {
 public:
  explicit LittleEndianOutputArchive(std::vector<std::byte>& out) : OutputArchive(this), out_(out) {}

  void write_bytes(const void* data, std::size_t size) {
    const auto* first = static_cast<const std::byte*>(data);
    out_.insert(out_.end(), first, first + size);
  }
  void write_varint(std::uint64_t value) {
    while (value >= 0x80) {
      out_.push_back(static_cast<std::byte>((value & 0x7f) | 0x80));
      value >>= 7;
    }
    out_.push_back(static_cast<std::byte>(value));
  }
  template <class T>
  void write_integer(T value) {
    using Unsigned = std::make_unsigned_t<T>;
    auto bits = static_cast<Unsigned>(value);
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      out_.push_back(static_cast<std::byte>(bits & 0xff));
      bits = static_cast<Unsigned>(bits >> 8);
    }
  }

 private:
  std::vector<std::byte>& out_;
};

class BoundedInputArchive : public cereal::InputArchive<BoundedInputArchive, cereal::AllowEmptyClassElision> {
 public:
  // `file_offset` is where `body` starts in the file; it only makes messages
  // point at the right byte.
  BoundedInputArchive(std::span<const std::byte> body, std::size_t file_offset)
      : InputArchive(this), body_(body), file_offset_(file_offset) {}

  std::size_t remaining() const noexcept { return body_.size() - position_; }
  std::size_t file_position() const noexcept { return file_offset_ + position_; }

  void read_bytes(void* data, std::size_t size) {
    require(size);
    if (size != 0) std::memcpy(data, body_.data() + position_, size);
    position_ += size;
  }
  std::uint64_t read_varint() {
    std::uint64_t value = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
      require(1);
      const auto byte = static_cast<std::uint8_t>(body_[position_++]);
      if (shift == 63 && byte > 1) break;
      value |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    throw SnapshotError(ErrorCode::inconsistent,
                        "inconsistent snapshot: a varint longer than 64 bits at offset " +
                            std::to_string(file_position()));
  }
  // A container's element count, bounded by the bytes left (see the top).
  std::uint64_t read_count() {
    const std::size_t at = file_position();
    const std::uint64_t count = read_varint();
    if (count > remaining()) {
      throw SnapshotError(ErrorCode::inconsistent, "inconsistent snapshot: a count of " + std::to_string(count) +
                                                       " at offset " + std::to_string(at) + " exceeds the " +
                                                       std::to_string(remaining()) + " bytes left");
    }
    return count;
  }
  template <class T>
  T read_integer() {
    using Unsigned = std::make_unsigned_t<T>;
    require(sizeof(T));
    Unsigned bits = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      bits = static_cast<Unsigned>(bits | (static_cast<Unsigned>(static_cast<std::uint8_t>(body_[position_ + i]))
                                           << (8 * i)));
    }
    position_ += sizeof(T);
    return static_cast<T>(bits);
  }

 private:
  void require(std::size_t size) const {
    if (size > remaining()) {
      throw SnapshotError(ErrorCode::truncated, "truncated snapshot: " + std::to_string(size) +
                                                    " bytes needed at offset " + std::to_string(file_position()) +
                                                    ", the body ends at offset " +
                                                    std::to_string(file_offset_ + body_.size()));
    }
  }

  std::span<const std::byte> body_;
  std::size_t file_offset_;
  std::size_t position_ = 0;
};

// Integers, fixed width, little-endian. bool is one byte, 0 or 1.
template <class T>
std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_SAVE_FUNCTION_NAME(LittleEndianOutputArchive& ar, const T& value) {
  static_assert(std::is_integral_v<T>, "the snapshot body stores no floating point");
  if constexpr (std::is_same_v<T, bool>) {
    ar.write_integer<std::uint8_t>(value ? 1 : 0);
  } else {
    ar.write_integer(value);
  }
}
template <class T>
std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, T& value) {
  static_assert(std::is_integral_v<T>, "the snapshot body stores no floating point");
  if constexpr (std::is_same_v<T, bool>) {
    const std::size_t at = ar.file_position();
    const auto byte = ar.read_integer<std::uint8_t>();
    if (byte > 1) {
      throw SnapshotError(ErrorCode::inconsistent, "inconsistent snapshot: a flag of " + std::to_string(byte) +
                                                       " at offset " + std::to_string(at) + " is neither 0 nor 1");
    }
    value = byte == 1;
  } else {
    value = ar.read_integer<T>();
  }
}

// Names are dropped: the body is positional.
template <class Archive, class T>
CEREAL_ARCHIVE_RESTRICT(BoundedInputArchive, LittleEndianOutputArchive)
CEREAL_SERIALIZE_FUNCTION_NAME(Archive& ar, cereal::NameValuePair<T>& pair) {
  ar(pair.value);
}

template <class T>
void CEREAL_SAVE_FUNCTION_NAME(LittleEndianOutputArchive& ar, const cereal::SizeTag<T>& tag) {
  ar.write_varint(static_cast<std::uint64_t>(tag.size));
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar, cereal::SizeTag<T>& tag) {
  tag.size = static_cast<std::remove_reference_t<decltype(tag.size)>>(ar.read_count());
}

// Bulk bytes, only for one-byte elements (strings, byte columns): wider
// elements go one by one through the little-endian integer path.
template <class T>
std::enable_if_t<sizeof(std::remove_pointer_t<T>) == 1> CEREAL_SAVE_FUNCTION_NAME(LittleEndianOutputArchive& ar,
                                                                                   const cereal::BinaryData<T>& data) {
  ar.write_bytes(data.data, static_cast<std::size_t>(data.size));
}
template <class T>
std::enable_if_t<sizeof(std::remove_pointer_t<T>) == 1> CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& ar,
                                                                                   cereal::BinaryData<T>& data) {
  ar.read_bytes(data.data, static_cast<std::size_t>(data.size));
}

}  // namespace cachealloc::snapshot::detail

CEREAL_SETUP_ARCHIVE_TRAITS(cachealloc::snapshot::detail::BoundedInputArchive,
                            cachealloc::snapshot::detail::LittleEndianOutputArchive)
