// The HTML page's payloads: varint columns, each gzip-compressed and
// base64-encoded into an inert script element that the page decodes with
// DecompressionStream (no network).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace cachealloc::analyzer::html {

// LEB128 varints; signed values zigzag-coded. The page decodes these with
// arithmetic, not 32-bit bit operations, so values up to 2^53 survive.
class VarintColumn {
 public:
  void u(std::uint64_t v) {
    while (v >= 0x80) {
      bytes_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    bytes_.push_back(static_cast<char>(v));
  }
  void s(std::int64_t v) { u((static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63)); }
  void delta(std::uint64_t v, std::uint64_t& previous) {
    s(static_cast<std::int64_t>(v - previous));
    previous = v;
  }
  const std::string& bytes() const noexcept { return bytes_; }

 private:
  std::string bytes_;
};

// One payload of the page: gzip, base64, in a script element of this id
// whose data-bytes attribute holds the decoded size. Throws std::runtime_error
// if zlib fails.
void write_payload(std::ostream& out, const char* id, std::string_view data);

}  // namespace cachealloc::analyzer::html
