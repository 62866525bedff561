#include <set>
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "cachealloc/analyzer/document.hpp"
#include "cachealloc/snapshot/text.hpp"

namespace cachealloc::analyzer {

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

std::string format_double(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

bool is_numeric(const Value& value) {
  return std::holds_alternative<std::uint64_t>(value) || std::holds_alternative<std::int64_t>(value) ||
         std::holds_alternative<double>(value);
}

// The text of a value in the table format.
std::string human(const Value& value, Unit unit) {
  return std::visit(
      Overloaded{
          [&](std::monostate) -> std::string { return unit == Unit::event ? "start" : "-"; },
          [](bool flag) -> std::string { return flag ? "yes" : "no"; },
          [&](std::uint64_t n) -> std::string {
            switch (unit) {
              case Unit::bytes: return format_bytes(n);
              case Unit::time: return format_time(n);
              case Unit::address: return format_address(n);
              case Unit::event: return "#" + std::to_string(n);
              default: return std::to_string(n);
            }
          },
          [&](std::int64_t n) -> std::string {
            // A change (diff): signed, in the unit's human form.
            if (unit != Unit::bytes) return (n > 0 && unit == Unit::count ? "+" : "") + std::to_string(n);
            const std::uint64_t size = n < 0 ? 0 - static_cast<std::uint64_t>(n) : static_cast<std::uint64_t>(n);
            return (n < 0 ? "-" : n > 0 ? "+" : "") + format_bytes(size);
          },
          [&](double d) -> std::string {
            if (!std::isfinite(d)) return "-";
            return unit == Unit::ratio ? format_double(d * 100.0, 1) + "%" : format_double(d, 3);
          },
          [](const std::string& s) -> std::string { return snapshot::printable(s); },
          [](const std::vector<std::string>& lines) -> std::string {
            return lines.empty() ? "" : snapshot::printable(lines.front());
          },
      },
      value);
}

// The text of a value in CSV: raw numbers, lists joined with " <- " (callee
// to caller, the way stacks read).
std::string raw(const Value& value, Unit unit) {
  return std::visit(Overloaded{
                        [](std::monostate) -> std::string { return ""; },
                        [](bool flag) -> std::string { return flag ? "true" : "false"; },
                        [&](std::uint64_t n) -> std::string {
                          return unit == Unit::address ? format_address(n) : std::to_string(n);
                        },
                        [](std::int64_t n) -> std::string { return std::to_string(n); },
                        [](double d) -> std::string { return std::isfinite(d) ? format_double(d, 6) : ""; },
                        [](const std::string& s) -> std::string { return s; },
                        [](const std::vector<std::string>& lines) -> std::string {
                          std::string joined;
                          for (const std::string& line : lines) {
                            if (!joined.empty()) joined += " <- ";
                            joined += line;
                          }
                          return joined;
                        },
                    },
                    value);
}

void json_value(JsonWriter& json, const Value& value, Unit unit) {
  std::visit(Overloaded{
                 [&](std::monostate) { json.null(); },
                 [&](bool flag) { json.value(flag); },
                 [&](std::uint64_t n) {
                   if (unit == Unit::address) {
                     json.value(format_address(n));
                   } else {
                     json.value(n);
                   }
                 },
                 [&](std::int64_t n) { json.value(n); },
                 [&](double d) { json.value(d); },
                 [&](const std::string& s) { json.value(std::string_view(s)); },
                 [&](const std::vector<std::string>& lines) {
                   json.begin_array();
                   for (const std::string& line : lines) json.value(std::string_view(line));
                   json.end_array();
                 },
             },
             value);
}

// Rows of one table in the table format: aligned to the rows buffered
// before the first line is written (all of them, or the first `align_rows`
// of a streamed table).
class TableWriter {
 public:
  // Columns marked json_only are left out.
  TableWriter(const std::vector<Column>& all_columns, std::ostream& out, std::size_t align_rows)
      : out_(out), align_rows_(align_rows) {
    for (std::size_t c = 0; c < all_columns.size(); ++c) {
      if (all_columns[c].json_only) continue;
      columns_.push_back(all_columns[c]);
      source_.push_back(c);
    }
    width_.resize(columns_.size());
    right_.assign(columns_.size(), false);
    for (std::size_t c = 0; c < columns_.size(); ++c) width_[c] = columns_[c].title.size();
  }
  // `rest`: the row of TableRest, whose empty cells have no such figure ("-").
  void add(std::vector<Value>&& full_row, bool rest = false) {
    ++rows_;
    Cells cells{std::vector<std::string>(columns_.size()), {}};
    for (std::size_t c = 0; c < columns_.size() && source_[c] < full_row.size(); ++c) {
      const Value& cell = full_row[source_[c]];
      const bool absent = std::holds_alternative<std::monostate>(cell) && columns_[c].unit != Unit::event;
      cells.text[c] = absent ? std::string(rest ? "-" : columns_[c].absent) : human(cell, columns_[c].unit);
      if (!aligned_ && is_numeric(cell)) right_[c] = true;
      // Lists (stacks) continue below their row, one item per line.
      if (const auto* lines = std::get_if<std::vector<std::string>>(&cell)) {
        for (std::size_t i = 1; i < lines->size(); ++i) cells.more.push_back(snapshot::printable((*lines)[i]));
      }
    }
    if (aligned_) {
      line(cells);
      return;
    }
    // The last column may be long (stacks); it is never padded.
    for (std::size_t c = 0; c + 1 < columns_.size(); ++c) width_[c] = std::max(width_[c], cells.text[c].size());
    buffered_.push_back(std::move(cells));
    if (buffered_.size() >= align_rows_) flush();
  }
  void finish() {
    if (rows_ == 0) {
      out_ << "  (none)\n";
      return;
    }
    flush();
  }

 private:
  struct Cells {
    std::vector<std::string> text;
    std::vector<std::string> more;
  };
  void flush() {
    if (!aligned_) {
      aligned_ = true;
      Cells header{{}, {}};
      for (const Column& column : columns_) header.text.push_back(column.title);
      line(header);
    }
    for (const Cells& cells : buffered_) line(cells);
    buffered_.clear();
  }
  void line(const Cells& cells) {
    std::string text = " ";
    const std::size_t columns = columns_.size();
    for (std::size_t c = 0; c < columns; ++c) {
      const std::size_t pad = c + 1 < columns ? width_[c] - std::min(width_[c], cells.text[c].size()) : 0;
      text += ' ';
      if (right_[c]) text.append(pad, ' ');
      text += cells.text[c];
      if (!right_[c]) text.append(pad, ' ');
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out_ << text << '\n';
    for (const std::string& more : cells.more) out_ << "        " << more << '\n';
  }

  std::vector<Column> columns_;       // those shown
  std::vector<std::size_t> source_;  // each one's index in a row
  std::ostream& out_;
  std::size_t align_rows_;
  std::vector<std::size_t> width_;
  std::vector<bool> right_;
  std::vector<Cells> buffered_;
  bool aligned_ = false;
  std::size_t rows_ = 0;
};

constexpr std::size_t kStreamAlignRows = 1000;

// One key once per object: the document's own keys (its fields, groups,
// tables and texts) are checked before anything is written, so a report
// that would name two figures alike is a bug caught by every test that
// renders it, never an object whose readers keep one value and drop the other.
void check_unique_keys(const Document& document) {
  std::set<std::string> top{"report", "lower_bounds", "approximate", "notes"};
  const auto claim = [&](const std::string& key) {
    if (!top.insert(key).second) throw std::logic_error("report " + document.report + ": JSON key '" + key + "' twice");
  };
  for (const Section& section : document.sections) {
    std::visit(Overloaded{
                   [&](const FieldGroup& group) {
                     if (!group.key.empty()) {
                       claim(group.key);
                       std::set<std::string> inner;
                       for (const Field& field : group.fields)
                         if (!inner.insert(field.key).second)
                           throw std::logic_error("report " + document.report + ": JSON key '" + group.key + "." +
                                                  field.key + "' twice");
                     } else {
                       for (const Field& field : group.fields) claim(field.key);
                     }
                   },
                   [&](const Table& table) {
                     claim(table.key);
                     if (table.rest) claim(table.key + "_rest");
                   },
                   [&](const Text& text) {
                     if (!text.table_only) claim(text.key);
                   },
               },
               section);
  }
  if (document.streamed) claim(document.streamed->key);
}

void render_json(const Document& document, std::ostream& out) {
  check_unique_keys(document);
  JsonWriter json(out);
  json.begin_object();
  json.key("report");
  json.value(std::string_view(document.report));
  std::vector<std::string> lower_bounds;
  for (const Section& section : document.sections) {
    std::visit(Overloaded{
                   [&](const FieldGroup& group) {
                     if (!group.key.empty()) {
                       json.key(group.key);
                       json.begin_object();
                     }
                     for (const Field& field : group.fields) {
                       json.key(field.key);
                       json_value(json, field.value, field.unit);
                       if (field.lower_bound)
                         lower_bounds.push_back(group.key.empty() ? field.key : group.key + "." + field.key);
                     }
                     if (!group.key.empty()) json.end_object();
                   },
                   [&](const Table& table) {
                     for (const Column& column : table.columns)
                       if (column.lower_bound) lower_bounds.push_back(table.key + "." + column.key);
                     json.key(table.key);
                     json.begin_array();
                     for (const auto& row : table.rows) {
                       json.begin_object();
                       for (std::size_t c = 0; c < table.columns.size() && c < row.size(); ++c) {
                         json.key(table.columns[c].key);
                         json_value(json, row[c], table.columns[c].unit);
                       }
                       json.end_object();
                     }
                     json.end_array();
                     if (table.rest) {
                       json.key(table.key + "_rest");
                       json.begin_object();
                       json.key("rows");
                       json.value(table.rest->count);
                       for (std::size_t c = 0; c < table.columns.size() && c < table.rest->cells.size(); ++c) {
                         if (!is_numeric(table.rest->cells[c])) continue;
                         json.key(table.columns[c].key);
                         json_value(json, table.rest->cells[c], table.columns[c].unit);
                       }
                       json.end_object();
                     }
                   },
                   [&](const Text& text) {
                     if (text.table_only) return;
                     json.key(text.key);
                     json.begin_array();
                     for (const std::string& line : text.lines) json.value(std::string_view(line));
                     json.end_array();
                   },
               },
               section);
  }
  std::vector<std::string> streamed_notes;
  if (document.streamed) {
    const StreamedTable& table = *document.streamed;
    json.key(table.key);
    json.begin_array();
    table.produce(
        [&](std::vector<Value>&& row) {
          json.begin_object();
          for (std::size_t c = 0; c < table.columns.size() && c < row.size(); ++c) {
            json.key(table.columns[c].key);
            json_value(json, row[c], table.columns[c].unit);
          }
          json.end_object();
        },
        streamed_notes);
    json.end_array();
  }
  // The marked figures are bounds, or, in an approximate document, neither.
  json.key("lower_bounds");
  json.begin_array();
  if (!document.approximate)
    for (const std::string& key : lower_bounds) json.value(std::string_view(key));
  json.end_array();
  if (document.approximate) {
    json.key("approximate");
    json.begin_array();
    for (const std::string& key : lower_bounds) json.value(std::string_view(key));
    json.end_array();
  }
  json.key("notes");
  json.begin_array();
  std::size_t in_notes = 0;
  for (const std::string& note : document.notes) in_notes += snapshot::invalid_utf8_bytes(note);
  for (const std::string& note : streamed_notes) in_notes += snapshot::invalid_utf8_bytes(note);
  const std::size_t replaced = json.replaced() + in_notes;
  for (const std::string& note : document.notes) json.value(std::string_view(note));
  for (const std::string& note : streamed_notes) json.value(std::string_view(note));
  if (replaced != 0) {
    json.value(std::to_string(replaced) +
               " byte(s) of text from the file were not valid UTF-8 and are shown as U+FFFD");
  }
  json.end_array();
  json.end_object();
  out << '\n';
}

void csv_rows(const std::vector<Column>& columns, const std::vector<Value>& row, CsvWriter& csv,
              std::vector<std::string>& cells) {
  cells.assign(columns.size(), std::string());
  for (std::size_t c = 0; c < columns.size() && c < row.size(); ++c) cells[c] = raw(row[c], columns[c].unit);
  csv.row(cells);
}

void csv_table(const Table& table, std::ostream& out) {
  CsvWriter csv(out);
  std::vector<std::string> cells;
  for (const Column& column : table.columns) cells.push_back(column.key);
  csv.row(cells);
  for (const auto& row : table.rows) csv_rows(table.columns, row, csv, cells);
  if (table.rest) csv_rows(table.columns, table.rest->cells, csv, cells);
}

void csv_streamed(const StreamedTable& table, std::ostream& out) {
  CsvWriter csv(out);
  std::vector<std::string> cells;
  for (const Column& column : table.columns) cells.push_back(column.key);
  csv.row(cells);
  std::vector<std::string> notes;
  table.produce([&](std::vector<Value>&& row) { csv_rows(table.columns, row, csv, cells); }, notes);
}

void csv_fields(const Document& document, std::ostream& out) {
  CsvWriter csv(out);
  csv.row({"key", "value", "lower_bound"});
  for (const Section& section : document.sections) {
    if (const FieldGroup* group = std::get_if<FieldGroup>(&section)) {
      for (const Field& field : group->fields) {
        csv.row({group->key.empty() ? field.key : group->key + "." + field.key, raw(field.value, field.unit),
                 !field.lower_bound ? "false" : document.approximate ? "approximate" : "true"});
      }
    }
  }
}

void render_csv(const Document& document, std::ostream& out) {
  const Table* chosen = nullptr;
  for (const Section& section : document.sections) {
    if (const Table* table = std::get_if<Table>(&section)) {
      if (chosen == nullptr || table->key == document.csv_table) chosen = table;
      if (document.csv_table.empty() || table->key == document.csv_table) break;
    }
  }
  if (document.csv_fields) return csv_fields(document, out);
  if (chosen != nullptr && (!document.streamed || document.csv_table != document.streamed->key))
    return csv_table(*chosen, out);
  if (document.streamed) return csv_streamed(*document.streamed, out);
  csv_fields(document, out);
}

// Text in a table comes from the file as often as from us (names, phases,
// the program's arguments): every string is printed through printable(),
// so no escape code, CR or newline of the file reaches the terminal.
void render_table(const Document& document, std::ostream& out) {
  out << snapshot::printable(document.title) << '\n';
  for (const Section& section : document.sections) {
    std::visit(Overloaded{
                   [&](const FieldGroup& group) {
                     if (group.json_only) return;
                     out << '\n' << snapshot::printable(group.title) << '\n';
                     std::size_t width = 0;
                     for (const Field& field : group.fields)
                       if (!field.json_only) width = std::max(width, field.label.size());
                     for (const Field& field : group.fields) {
                       if (field.json_only) continue;
                       // A figure that is not known reads "unknown", never 0 (JSON: null).
                       const bool empty = std::holds_alternative<std::monostate>(field.value);
                       const bool unknown = empty && field.unit != Unit::event && field.unit != Unit::none;
                       const std::string text = empty && field.absent != nullptr ? std::string(field.absent)
                                                : unknown                        ? std::string("unknown")
                                                                                 : human(field.value, field.unit);
                       out << "  " << field.label << std::string(width - field.label.size() + 2, ' ')
                           << (field.lower_bound && !empty ? (document.approximate ? "~ " : ">= ") : "") << text
                           << '\n';
                       if (const auto* lines = std::get_if<std::vector<std::string>>(&field.value)) {
                         for (std::size_t i = 1; i < lines->size(); ++i)
                           out << "  " << std::string(width + 2, ' ') << snapshot::printable((*lines)[i]) << '\n';
                       }
                     }
                   },
                   [&](const Table& table) {
                     out << '\n' << snapshot::printable(table.title) << '\n';
                     std::vector<Column> columns = table.columns;
                     for (Column& column : columns)
                       if (column.lower_bound) column.title = (document.approximate ? "~ " : ">= ") + column.title;
                     TableWriter writer(columns, out, table.rows.size() + 1);
                     for (const auto& row : table.rows) writer.add(std::vector<Value>(row));
                     if (table.rest) writer.add(std::vector<Value>(table.rest->cells), true);
                     writer.finish();
                   },
                   [&](const Text& text) {
                     out << '\n';
                     if (!text.title.empty()) out << snapshot::printable(text.title) << '\n';
                     for (const std::string& line : text.lines) out << "  " << snapshot::printable(line) << '\n';
                   },
               },
               section);
  }
  std::vector<std::string> notes = document.notes;
  if (document.streamed) {
    const StreamedTable& table = *document.streamed;
    out << '\n' << snapshot::printable(table.title) << '\n';
    TableWriter writer(table.columns, out, kStreamAlignRows);
    table.produce([&](std::vector<Value>&& row) { writer.add(std::move(row)); }, notes);
    writer.finish();
  }
  if (!notes.empty()) {
    out << "\nnotes\n";
    for (const std::string& note : notes) out << "  - " << snapshot::printable(note) << '\n';
  }
}

}  // namespace

std::optional<Format> parse_format(std::string_view name) noexcept {
  if (name == "table") return Format::table;
  if (name == "csv") return Format::csv;
  if (name == "json") return Format::json;
  return std::nullopt;
}

std::vector<std::string> csv_tables(const Document& document) {
  std::vector<std::string> names;
  if (document.csv_fields) names.emplace_back("fields");
  for (const Section& section : document.sections) {
    if (const Table* table = std::get_if<Table>(&section)) names.push_back(table->key);
  }
  if (document.streamed) names.push_back(document.streamed->key);
  if (names.empty()) names.emplace_back("fields");
  return names;
}

void render_csv_table(const Document& document, std::string_view name, std::ostream& out) {
  if (name == "fields") return csv_fields(document, out);
  for (const Section& section : document.sections) {
    if (const Table* table = std::get_if<Table>(&section); table != nullptr && table->key == name)
      return csv_table(*table, out);
  }
  if (document.streamed && document.streamed->key == name) csv_streamed(*document.streamed, out);
}

void render(const Document& document, Format format, std::ostream& out) {
  switch (format) {
    case Format::table: render_table(document, out); break;
    case Format::csv: render_csv(document, out); break;
    case Format::json: render_json(document, out); break;
  }
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  return format_double(value, 2) + " " + kUnits[unit];
}

std::string format_time(std::uint64_t ns) {
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, "+%" PRIu64 ".%06" PRIu64 "s", ns / 1'000'000'000, (ns / 1000) % 1'000'000);
  return buffer;
}

std::string format_address(std::uint64_t address) {
  char buffer[24];
  std::snprintf(buffer, sizeof buffer, "0x%" PRIx64, address);
  return buffer;
}

// ---------------------------------------------------------------------------

void JsonWriter::separate() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ << ',';
    first_.back() = false;
  }
}

void JsonWriter::begin_object() {
  separate();
  out_ << '{';
  first_.push_back(true);
}

void JsonWriter::end_object() {
  first_.pop_back();
  out_ << '}';
}

void JsonWriter::begin_array() {
  separate();
  out_ << '[';
  first_.push_back(true);
}

void JsonWriter::end_array() {
  first_.pop_back();
  out_ << ']';
}

void JsonWriter::key(std::string_view name) {
  value(name);
  out_ << ':';
  after_key_ = true;
}

void JsonWriter::value(std::string_view text) {
  separate();
  // Escaped as text.hpp says: no raw control byte, invalid bytes replaced.
  std::string quoted = "\"";
  snapshot::append_json_string(quoted, text, &replaced_);
  quoted += '"';
  out_ << quoted;
}

void JsonWriter::value(std::uint64_t number) {
  separate();
  out_ << number;
}

void JsonWriter::value(std::int64_t number) {
  separate();
  out_ << number;
}

void JsonWriter::value(double number) {
  separate();
  if (!std::isfinite(number)) {
    out_ << "null";
    return;
  }
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.6g", number);
  out_ << buffer;
}

void JsonWriter::value(bool flag) {
  separate();
  out_ << (flag ? "true" : "false");
}

void JsonWriter::null() {
  separate();
  out_ << "null";
}

void CsvWriter::row(const std::vector<std::string>& fields) {
  std::string repaired;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i != 0) out_ << ',';
    const std::string* chosen = &fields[i];
    // Control characters and invalid bytes spelled out, as in tables.
    if (!snapshot::is_printable(*chosen)) {
      repaired = snapshot::printable(*chosen);
      chosen = &repaired;
    }
    const std::string& field = *chosen;
    if (field.find_first_of(",\"\r\n") == std::string::npos) {
      out_ << field;
      continue;
    }
    out_ << '"';
    for (const char c : field) {
      if (c == '"') out_ << '"';
      out_ << c;
    }
    out_ << '"';
  }
  out_ << "\r\n";
}

}  // namespace cachealloc::analyzer
