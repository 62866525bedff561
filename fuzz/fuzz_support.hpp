// What every fuzz target asserts of a refusal and of an output, and the
// input handling the targets share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <span>
#include <sstream>
#include <string_view>

#include "cachealloc/analyzer/document.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/load.hpp"
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

// A line a command prints as it is (check's verdicts): valid UTF-8, one
// line, no control character of the file.
inline void check_line(std::string_view line) {
  check_utf8(line);
  for (const char c : line) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) std::abort();
  }
}

// Text for a terminal: valid UTF-8, and no control character but the
// newlines that end its lines (the file's own are spelled out).
inline void check_table(std::string_view text) {
  check_utf8(text);
  for (const char c : text) {
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\n') || c == 0x7f) std::abort();
  }
}

// The document in every format: the table for a terminal, JSON and CSV
// valid UTF-8; every row of every table has one cell per column (CSV is
// never ragged).
inline void render_all(const analyzer::Document& document) {
  for (const analyzer::Section& section : document.sections) {
    if (const auto* table = std::get_if<analyzer::Table>(&section)) {
      for (const auto& row : table->rows) {
        if (row.size() != table->columns.size()) std::abort();
      }
    }
  }
  for (const analyzer::Format format : {analyzer::Format::table, analyzer::Format::csv, analyzer::Format::json}) {
    std::ostringstream out;
    analyzer::render(document, format, out);
    if (format == analyzer::Format::table) {
      check_table(out.str());
    } else {
      check_utf8(out.str());
    }
  }
}

// The replays, the sweep and the HTML page cost time per event; an input of
// more events than this is skipped so that one execution stays in
// milliseconds (max_len = 4096 keeps nearly every input under it).
inline constexpr std::size_t kMaxEvents = 4096;

// load() of the input, or nullopt when it is refused (the refusal checked)
// or holds more than kMaxEvents events.
inline std::optional<snapshot::Snapshot> load_small(std::span<const std::byte> bytes) {
  try {
    snapshot::Snapshot snapshot = snapshot::load(bytes);
    if (snapshot.events.size() > kMaxEvents) return std::nullopt;
    return snapshot;
  } catch (const snapshot::SnapshotError& error) {
    check_message(error.what());
    return std::nullopt;
  }
}

inline std::span<const std::byte> as_bytes(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

// The options of one execution, from the input's last byte: a mutation there
// tries other options on the same file.
inline unsigned option_bits(const std::uint8_t* data, std::size_t size) { return size == 0 ? 0 : data[size - 1]; }

}  // namespace cachealloc::fuzz
