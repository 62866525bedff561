// Text that came from a file, made safe to print.
//
// Strings in a snapshot (function and file names, annotations, the program's
// arguments) are whatever the recording process or a damaged file held. JSON
// must be valid UTF-8, and a table or an error message on a terminal must
// not carry escape codes, carriage returns or newlines from the file. These
// are the one place that rule lives; the renderers and the CLI's error
// printer call them.
//
// UTF-8 here is RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF. Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace cachealloc::snapshot {

// The length of the valid UTF-8 sequence starting at text[at], or 0 when
// the byte there does not start one.
std::size_t utf8_sequence_length(std::string_view text, std::size_t at) noexcept;

// Bytes of `text` that are not part of a valid UTF-8 sequence.
std::size_t invalid_utf8_bytes(std::string_view text) noexcept;

// `text` with each invalid byte replaced by U+FFFD. Adds the number replaced
// to *replaced when given.
std::string to_valid_utf8(std::string_view text, std::size_t* replaced = nullptr);

// `text` for a terminal, on one line: valid UTF-8 is kept, control
// characters (C0, DEL, C1) and invalid bytes become \xNN (\n, \r and \t
// become \n, \r and \t, spelled out).
std::string printable(std::string_view text);

}  // namespace cachealloc::snapshot
