// Reports as data, and the three renderers that print them.
//
// Every report builder returns a Document: groups of named fields, tables and
// lines of text, each value tagged with its unit. The renderers decide how a
// unit looks (1.50 GiB in a table, 1610612736 in JSON and CSV), so a report is
// written once and every format stays consistent with the others.
//
// Formats:
//   table  for people: titled sections, aligned columns, human units.
//   json   one object: {"report": ..., fields..., "<group>": {...},
//          "<table>": [{column: value}...], "lower_bounds": [...], "notes": [...]}.
//          Fields of a group with an empty key sit at the top level.
//   csv    RFC 4180 (CRLF, quoted when needed) with a header row: the
//          document's csv_table, or its first table, or "key,value,lower_bound"
//          rows of its fields when it has no table or asks for them.
//
// Thread safety: plain values; render() is reentrant.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace cachealloc::analyzer {

enum class Unit : std::uint8_t {
  none,
  count,
  bytes,    // table: 1.50 GiB; json/csv: the integer
  ratio,    // 0..1; table: 12.3%; json/csv: 0.1234
  time,     // ns since the first event; table: +1.234567s
  address,  // hex text in every format
  event,    // an event index; monostate means "the start of the window"
};

using Value = std::variant<std::monostate, bool, std::uint64_t, std::int64_t, double, std::string,
                           std::vector<std::string>>;

struct Field {
  std::string key;
  std::string label;
  Value value;
  Unit unit = Unit::none;
  bool lower_bound = false;  // the true figure may be larger (events were lost)
  bool json_only = false;    // in JSON and CSV only: a table leaves the line out
  // What an empty value (monostate) reads in the table format when it is not
  // an unknown figure: "none" where the empty value means there is none (no
  // cap). nullptr: "unknown" for a figure with a unit, "start" for an event,
  // "-" for text. JSON writes null, CSV nothing.
  const char* absent = nullptr;
};

struct FieldGroup {
  std::string key;  // empty: the fields are top-level JSON keys
  std::string title;
  std::vector<Field> fields;
  bool json_only = false;  // machine-readable duplicates of what a table shows
  FieldGroup& add(std::string field_key, std::string label, Value value, Unit unit = Unit::none,
                  bool lower_bound = false) {
    fields.push_back(Field{std::move(field_key), std::move(label), std::move(value), unit, lower_bound});
    return *this;
  }
  // What the last field added reads in a table when its value is empty (Field::absent).
  FieldGroup& absent_as(const char* text) {
    if (!fields.empty()) fields.back().absent = text;
    return *this;
  }
  // Marks the last field added as JSON and CSV only.
  FieldGroup& json_only_if(bool hidden) {
    if (!fields.empty()) fields.back().json_only = hidden;
    return *this;
  }
};

struct Column {
  std::string key;
  std::string title;
  Unit unit = Unit::none;
  // What an empty cell (monostate) reads in the table format: "unknown",
  // as docs/GLOSSARY.md promises, unless the column says the row has no
  // such figure at all ("-": an inactive block's request). An event column
  // reads "start" (the start of the window). JSON writes null, CSV nothing.
  const char* absent = "unknown";
  // In JSON and CSV only: the table format leaves the column out (detail
  // that would make a table too wide to read; its notes say where it is).
  bool json_only = false;
  // Every cell may be below the true figure (events were lost): the table
  // format marks the title ">=" ("~" where the document is approximate),
  // JSON lists "<table key>.<column key>" in lower_bounds.
  bool lower_bound = false;
};

// The rows a listing left out, summed ("... and 12 more sites"): the table
// format prints `cells` as a last row (an empty cell reads "-": the rest has
// no address or rank of its own), CSV as a last record, JSON as
// "<table key>_rest": {"rows": count, column: value...} with the numeric
// cells only (a label or an empty rank says nothing a program needs).
struct TableRest {
  std::uint64_t count = 0;
  std::vector<Value> cells;  // one per column, as a row
};

struct Table {
  std::string key;
  std::string title;
  std::vector<Column> columns;
  std::vector<std::vector<Value>> rows;  // each row has columns.size() cells
  std::optional<TableRest> rest;
};

struct Text {
  std::string key;
  std::string title;
  std::vector<std::string> lines;
  // Shown in tables only: JSON and CSV carry the same words as a field.
  bool table_only = false;
};

using Section = std::variant<FieldGroup, Table, Text>;

// A table too long to hold in memory (every event of a large trace): its
// rows are produced while it is rendered, each written as it comes, so
// memory stays that of one row. `produce` calls `row` once per row, in
// order, and may add notes (shown after the document's own). It runs once,
// inside render(), and may read whatever the report's source holds, which
// must outlive the render. The table format aligns columns to the first
// 1,000 rows; a longer cell later only widens its own line.
using RowSink = std::function<void(std::vector<Value>&&)>;
struct StreamedTable {
  std::string key;
  std::string title;
  std::vector<Column> columns;
  std::function<void(const RowSink& row, std::vector<std::string>& notes)> produce;
};

struct Document {
  std::string report;  // the subcommand that made it
  std::string title;   // the first line of the table format
  std::deque<Section> sections;  // a deque: references from group()/table() stay valid
  std::vector<std::string> notes;  // warnings and caveats, shown last
  std::string csv_table;           // the table CSV writes; empty: the first one
  // The figures marked lower_bound are approximate instead, neither exact
  // nor bounds: events were dropped anywhere in the run (a stream recorded
  // with when_full=drop), so the replay may be above or below the run.
  // Tables mark them "~", JSON lists them under "approximate" (and
  // "lower_bounds" is empty), CSV's lower_bound column reads "approximate".
  bool approximate = false;
  bool csv_fields = false;         // CSV writes the fields as key,value rows instead
  // Rendered after the sections, before the notes.
  std::optional<StreamedTable> streamed;

  FieldGroup& group(std::string key, std::string group_title) {
    sections.emplace_back(FieldGroup{std::move(key), std::move(group_title), {}, false});
    return std::get<FieldGroup>(sections.back());
  }
  Table& table(std::string key, std::string table_title, std::vector<Column> columns) {
    sections.emplace_back(Table{std::move(key), std::move(table_title), std::move(columns), {}, std::nullopt});
    return std::get<Table>(sections.back());
  }
  Text& text(std::string key, std::string text_title) {
    sections.emplace_back(Text{std::move(key), std::move(text_title), {}});
    return std::get<Text>(sections.back());
  }
};

enum class Format { table, csv, json };

// "table", "csv" or "json".
std::optional<Format> parse_format(std::string_view name) noexcept;

void render(const Document& document, Format format, std::ostream& out);

// The tables CSV can write, in order: "fields" first when the document's CSV
// is its fields (csv_fields), then every table's key (the streamed one last).
std::vector<std::string> csv_tables(const Document& document);
// CSV of one of them ("fields": the key,value,lower_bound rows).
// Precondition: `table` is one of csv_tables(document).
void render_csv_table(const Document& document, std::string_view table, std::ostream& out);

// Human byte counts: "512 B", "1.50 KiB", ... "2.00 TiB".
std::string format_bytes(std::uint64_t bytes);
// "+1.234567s" for a duration in ns.
std::string format_time(std::uint64_t ns);
std::string format_address(std::uint64_t address);

// A streaming JSON writer: the caller nests begin/end calls; commas and
// escaping are handled here. Doubles are written with up to 6 significant
// decimals; NaN and infinities become null. The output is always valid
// UTF-8: a byte of a string that is not (text from a damaged file) is
// written as U+FFFD and counted in replaced().
class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}
  void begin_object();
  void end_object();
  void begin_array();
  void end_array();
  void key(std::string_view name);
  void value(std::string_view text);
  void value(const char* text) { value(std::string_view(text)); }
  void value(std::uint64_t number);
  void value(std::int64_t number);
  void value(double number);
  void value(bool flag);
  void null();
  // Invalid UTF-8 bytes written as U+FFFD so far.
  std::size_t replaced() const noexcept { return replaced_; }

 private:
  void separate();
  std::size_t replaced_ = 0;
  std::ostream& out_;
  std::vector<bool> first_;  // per open container: nothing written yet
  bool after_key_ = false;
};

// Writes RFC 4180 records: fields quoted when they hold a comma, quote, CR or
// LF; quotes doubled; records end with CRLF. Invalid UTF-8 bytes become U+FFFD.
class CsvWriter {
 public:
  explicit CsvWriter(std::ostream& out) : out_(out) {}
  void row(const std::vector<std::string>& fields);

 private:
  std::ostream& out_;
};

}  // namespace cachealloc::analyzer
