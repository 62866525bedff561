// The varint reader's paths out of its inline fast path, the codec's error,
// and the switch between the PEXT and the portable varint merge.
#include "varint.hpp"

#include <atomic>

#include "cachealloc/snapshot/format.hpp"
#include "cpu_features.hpp"

namespace cachealloc::snapshot::detail {
namespace {

std::atomic<bool> g_varint_pext{pext_is_fast()};

}  // namespace

bool varint_pext() noexcept { return g_varint_pext.load(std::memory_order_relaxed); }

bool set_varint_pext(bool on) noexcept {
  const bool now = on && pext_is_fast();
  g_varint_pext.store(now, std::memory_order_relaxed);
  return now;
}

namespace codec {

void fail(const std::string& what) {
  throw SnapshotError(ErrorCode::inconsistent, "inconsistent snapshot: " + what);
}
void fail_at(std::uint64_t event, const std::string& what) {
  fail("event " + std::to_string(event) + " " + what);
}

std::uint64_t ColumnReader::long_varint(std::uint64_t event) {
  // With 10 bytes left no bound check can fail. A varint of up to 8 bytes
  // (56 bits: every time delta and address we have seen) is one load and a
  // few shifts instead of a loop.
  if (size_ - position_ >= 10) {
    std::uint64_t word;
    std::memcpy(&word, data_ + position_, sizeof word);
    word = le64(word);
    if (const std::uint64_t stops = ~word & 0x8080808080808080ull; stops != 0) {
      const auto last_bit = static_cast<unsigned>(std::countr_zero(stops));  // 8 * (length - 1) + 7
      std::uint64_t x = last_bit == 63 ? word : word & ((std::uint64_t{1} << (last_bit + 1)) - 1);
      x &= 0x7f7f7f7f7f7f7f7full;
      x = ((x & 0x7f007f007f007f00ull) >> 1) | (x & 0x007f007f007f007full);
      x = ((x & 0x3fff00003fff0000ull) >> 2) | (x & 0x00003fff00003fffull);
      x = ((x & 0x0fffffff00000000ull) >> 4) | (x & 0x000000000fffffffull);
      position_ += (last_bit + 1) / 8;
      return x;
    }
    // 9 or 10 bytes, or too long: byte by byte.
    const std::uint8_t* at = data_ + position_;
    std::uint64_t value = 0;
    for (unsigned i = 0; i < 10; ++i) {
      const std::uint8_t next = at[i];
      if (i == 9 && next > 1) break;
      value |= static_cast<std::uint64_t>(next & 0x7f) << (7 * i);
      if ((next & 0x80) == 0) {
        position_ += i + 1;
        return value;
      }
    }
    position_ += 10;  // where the bounded loop below would stop
    fail_at(event, "has a varint longer than 64 bits in the " + std::string(name_) + " column");
  }
  std::uint64_t value = 0;
  for (unsigned shift = 0; shift < 64; shift += 7) {
    const std::uint8_t next = byte(event);
    if (shift == 63 && next > 1) break;
    value |= static_cast<std::uint64_t>(next & 0x7f) << shift;
    if ((next & 0x80) == 0) return value;
  }
  fail_at(event, "has a varint longer than 64 bits in the " + std::string(name_) + " column");
}

void ColumnReader::ends_early(std::uint64_t event) const {
  fail("the " + std::string(name_) + " column ends before event " + std::to_string(event));
}

}  // namespace codec
}  // namespace cachealloc::snapshot::detail
