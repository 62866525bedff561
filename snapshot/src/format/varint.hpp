// The varints of the event columns (LEB128, zigzag for signed values) and
// ColumnReader, which reads one column's bytes and varints with its bounds
// checked. Private to the snapshot library.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace cachealloc::snapshot::detail::codec {

inline std::uint64_t zigzag(std::int64_t value) {
  return (static_cast<std::uint64_t>(value) << 1) ^ static_cast<std::uint64_t>(value >> 63);
}
inline std::int64_t unzigzag(std::uint64_t value) {
  return static_cast<std::int64_t>(value >> 1) ^ -static_cast<std::int64_t>(value & 1);
}

inline std::size_t varint_length(std::uint64_t value) {
  std::size_t length = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++length;
  }
  return length;
}

inline void put_varint(std::vector<std::uint8_t>& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<std::uint8_t>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<std::uint8_t>(value));
}

// Little-endian bytes as loaded from memory, on any host.
inline std::uint64_t le64(std::uint64_t loaded) {
  if constexpr (std::endian::native == std::endian::big) return __builtin_bswap64(loaded);
  return loaded;
}

// The payload bits of a varint of up to 8 bytes, already cut after its last
// byte, side by side: PEXT with 0x7f in every byte, one instruction where the
// portable merge is six. As inline assembly so that no function needs a
// target attribute: only the decoder that varint_pext() picked runs it.
#if defined(__x86_64__)
inline std::uint64_t gather_payload_pext(std::uint64_t cut) {
  std::uint64_t out;
  asm("pextq %2, %1, %0" : "=r"(out) : "r"(cut), "r"(std::uint64_t{0x7f7f7f7f7f7f7f7full}));
  return out;
}
#else
inline std::uint64_t gather_payload_pext(std::uint64_t) { __builtin_unreachable(); }
#endif

// The codec's one error, SnapshotError{inconsistent}; out of line and cold
// so that the decoders' loops keep only a call on their error paths.
[[noreturn, gnu::cold, gnu::noinline]] void fail(const std::string& what);
[[noreturn, gnu::cold, gnu::noinline]] void fail_at(std::uint64_t event, const std::string& what);

// One column of a block, read front to back; `name` and the event index only
// make messages say where a column went wrong.
class ColumnReader {
 public:
  ColumnReader(const std::vector<std::uint8_t>& bytes, const char* name)
      : data_(bytes.data()), size_(bytes.size()), fast_end_(size_ >= 10 ? size_ - 9 : 0), name_(name) {}

  std::uint8_t byte(std::uint64_t event) {
    if (position_ == size_) [[unlikely]]
      ends_early(event);
    return data_[position_++];
  }
  // Inline: with 10 bytes left no bound check can fail, and a varint of up
  // to 8 bytes (56 bits: every time delta, address delta and size we have
  // seen) is one load and a few shifts. Encoding 3 stores 3-4 byte address
  // deltas, which were a call each out of line. The rest, and the last
  // bytes of a column, go the careful way (long_varint, varint.cpp).
  // The bound is one compare against fast_end_, and the mask and the first
  // merge step are 3 operations fewer than the general form in long_varint:
  // the decoder reads about two varints per event.
  //
  // kPext: the merge is one PEXT (gather_payload_pext), for the decoder
  // varint_pext() picked; the values are the same.
  template <bool kPext = false>
  std::uint64_t varint(std::uint64_t event) {
    if (position_ < fast_end_) [[likely]] {
      std::uint64_t word;
      std::memcpy(&word, data_ + position_, sizeof word);
      word = le64(word);
      if ((word & 0x80) == 0) {
        ++position_;
        return word & 0x7f;
      }
      if (const std::uint64_t stops = ~word & 0x8080808080808080ull; stops != 0) [[likely]] {
        const auto last_bit = static_cast<unsigned>(std::countr_zero(stops));  // 8 * (length - 1) + 7
        position_ += (last_bit + 1) / 8;
        if constexpr (kPext) return gather_payload_pext(word & (~std::uint64_t{0} >> (63 - last_bit)));
        std::uint64_t x = word & (~std::uint64_t{0} >> (63 - last_bit)) & 0x7f7f7f7f7f7f7f7full;
        x -= (x & 0x7f007f007f007f00ull) >> 1;  // each 16-bit lane: low + 128 * high
        x = ((x & 0x3fff00003fff0000ull) >> 2) | (x & 0x00003fff00003fffull);
        x = ((x & 0x0fffffff00000000ull) >> 4) | (x & 0x000000000fffffffull);
        return x;
      }
      return long_varint(event);
    }
    if (position_ + 1 < size_) {
      const std::uint8_t first = data_[position_];
      if (first < 0x80) {
        ++position_;
        return first;
      }
      const std::uint8_t second = data_[position_ + 1];
      if (second < 0x80) {
        position_ += 2;
        return (first & 0x7fu) | (std::uint64_t{second} << 7);
      }
    } else if (position_ < size_ && data_[position_] < 0x80) {
      return data_[position_++];
    }
    return long_varint(event);
  }
  void expect_consumed() const {
    if (position_ != size_) {
      fail("the " + std::string(name_) + " column has " + std::to_string(size_ - position_) +
           " bytes after the last event");
    }
  }

 private:
  [[gnu::noinline]] std::uint64_t long_varint(std::uint64_t event);
  [[noreturn, gnu::cold, gnu::noinline]] void ends_early(std::uint64_t event) const;

  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t fast_end_;  // below it, 10 bytes remain
  const char* name_;
  std::size_t position_ = 0;
};

}  // namespace cachealloc::snapshot::detail::codec
