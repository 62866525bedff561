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

// Whether the valid sequence of `length` bytes at text[at] is a control
// character: C0 (U+0000-U+001F), DEL (U+007F) or C1 (U+0080-U+009F, CSI
// U+009B and NEL U+0085 among them). The one definition every output uses.
bool is_control_character(std::string_view text, std::size_t at, std::size_t length) noexcept;

// Whether printable(text) == text: valid UTF-8 without a control character.
bool is_printable(std::string_view text) noexcept;

// `text` for a terminal, on one line: valid UTF-8 is kept, control
// characters (C0, DEL, C1) and invalid bytes become \xNN (\n, \r and \t
// become \n, \r and \t, spelled out). Tables, CSV fields and collapsed
// stacks are written through it.
std::string printable(std::string_view text);

// `text` appended to `out` as the inside of a JSON string (RFC 8259): valid
// UTF-8 is kept, '"' and '\\' escaped, control characters (C0, DEL, C1) as
// \u00XX (\n, \r and \t as such), so no raw control byte reaches the
// output while the value is kept; each invalid byte becomes \ufffd and is
// counted in *replaced when given.
void append_json_string(std::string& out, std::string_view text, std::size_t* replaced = nullptr);

}  // namespace cachealloc::snapshot
