#include "cachealloc/snapshot/text.hpp"

#include <cstdint>

namespace cachealloc::snapshot {

std::size_t utf8_sequence_length(std::string_view text, std::size_t at) noexcept {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  std::uint32_t code = 0;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
    code = lead & 0x1f;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    code = lead & 0x0f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    code = lead & 0x07;
  } else {
    return 0;  // a continuation byte, an overlong lead (0xc0, 0xc1) or past U+10FFFF
  }
  if (at + length > text.size()) return 0;
  for (std::size_t i = 1; i < length; ++i) {
    const unsigned char next = byte(at + i);
    if ((next & 0xc0) != 0x80) return 0;
    code = (code << 6) | (next & 0x3f);
  }
  if ((length == 3 && code < 0x800) || (length == 4 && code < 0x10000) || code > 0x10ffff ||
      (code >= 0xd800 && code <= 0xdfff))
    return 0;
  return length;
}

std::size_t invalid_utf8_bytes(std::string_view text) noexcept {
  std::size_t invalid = 0;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t length = utf8_sequence_length(text, at);
    if (length == 0) {
      ++invalid;
      ++at;
    } else {
      at += length;
    }
  }
  return invalid;
}

std::string to_valid_utf8(std::string_view text, std::size_t* replaced) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t length = utf8_sequence_length(text, at);
    if (length == 0) {
      out += "\xef\xbf\xbd";  // U+FFFD
      if (replaced) ++*replaced;
      ++at;
    } else {
      out.append(text.substr(at, length));
      at += length;
    }
  }
  return out;
}

bool is_control_character(std::string_view text, std::size_t at, std::size_t length) noexcept {
  const auto c = static_cast<unsigned char>(text[at]);
  if (length == 1) return c < 0x20 || c == 0x7f;
  return length == 2 && c == 0xc2 && static_cast<unsigned char>(text[at + 1]) < 0xa0;
}

bool is_printable(std::string_view text) noexcept {
  for (std::size_t at = 0; at < text.size();) {
    const auto c = static_cast<unsigned char>(text[at]);
    if (c >= 0x20 && c < 0x7f) {
      ++at;
      continue;
    }
    const std::size_t length = utf8_sequence_length(text, at);
    if (length == 0 || is_control_character(text, at, length)) return false;
    at += length;
  }
  return true;
}

void append_json_string(std::string& out, std::string_view text, std::size_t* replaced) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (std::size_t at = 0; at < text.size();) {
    const auto c = static_cast<unsigned char>(text[at]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
      ++at;
      continue;
    }
    const std::size_t length = utf8_sequence_length(text, at);
    if (length == 0) {
      out += "\\ufffd";
      if (replaced) ++*replaced;
      ++at;
      continue;
    }
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (is_control_character(text, at, length)) {
      const unsigned code = length == 1 ? c : static_cast<unsigned char>(text[at + 1]);  // C1: U+0080-U+009F
      out += "\\u00";
      out += kDigits[code >> 4];
      out += kDigits[code & 0xf];
    } else {
      out.append(text.substr(at, length));
    }
    at += length;
  }
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto hex = [&](unsigned char c) {
    static constexpr char kDigits[] = "0123456789abcdef";
    out += "\\x";
    out += kDigits[c >> 4];
    out += kDigits[c & 0xf];
  };
  for (std::size_t at = 0; at < text.size();) {
    const auto c = static_cast<unsigned char>(text[at]);
    const std::size_t length = utf8_sequence_length(text, at);
    if (length == 0) {
      hex(c);
      ++at;
      continue;
    }
    if (length == 1) {
      if (c == '\n') out += "\\n";
      else if (c == '\r') out += "\\r";
      else if (c == '\t') out += "\\t";
      else if (is_control_character(text, at, length)) hex(c);
      else out += static_cast<char>(c);
    } else if (is_control_character(text, at, length)) {
      // C1 controls U+0080..U+009F (CSI among them): shown by their bytes.
      hex(c);
      hex(static_cast<unsigned char>(text[at + 1]));
    } else {
      out.append(text.substr(at, length));
    }
    at += length;
  }
  return out;
}

}  // namespace cachealloc::snapshot
