// What every fuzz target asserts of a refusal and of an output.
#pragma once

#include <cstdlib>
#include <string_view>

#include "cachealloc/snapshot/text.hpp"

namespace cachealloc::fuzz {

// A refusal is one line once printed: the CLI prints what() through
// printable(), which must leave no newline, CR or other control character.
inline void check_message(std::string_view what) {
  if (what.empty()) std::abort();
  for (const char c : snapshot::printable(what)) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) std::abort();
  }
}

// JSON and CSV are valid UTF-8 whatever the input held.
inline void check_utf8(std::string_view text) {
  if (snapshot::invalid_utf8_bytes(text) != 0) std::abort();
}

}  // namespace cachealloc::fuzz
