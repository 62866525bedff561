// Test support: strict readers for what the renderers write, so tests can
// check that JSON parses and CSV keeps one column count, without trusting
// the writers under test. Header-only, for tests/test_analyzer_*.cpp.
#pragma once

#include <cctype>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace cachealloc::analyzer::testing {

struct Json {
  using Object = std::map<std::string, Json>;
  using Array = std::vector<Json>;
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<Array>, std::shared_ptr<Object>> value;

  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(value); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<Array>>(value); }
  bool is_number() const { return std::holds_alternative<double>(value); }
  const Object& object() const { return *std::get<std::shared_ptr<Object>>(value); }
  const Array& array() const { return *std::get<std::shared_ptr<Array>>(value); }
  double number() const { return std::get<double>(value); }
  bool has(const std::string& key) const { return is_object() && object().count(key) != 0; }
  const Json& operator[](const std::string& key) const { return object().at(key); }
};

// Parses RFC 8259 JSON; throws std::runtime_error with the offset on error.
inline Json parse_json(const std::string& text) {
  std::size_t i = 0;
  auto fail = [&](const char* what) { throw std::runtime_error(std::string(what) + " at " + std::to_string(i)); };
  auto skip = [&] {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  auto expect = [&](const char* word) {
    for (const char* c = word; *c; ++c, ++i) {
      if (i >= text.size() || text[i] != *c) fail("bad literal");
    }
  };
  std::function<Json()> value;
  auto string = [&]() -> std::string {
    if (text[i] != '"') fail("expected string");
    ++i;
    std::string out;
    while (true) {
      if (i >= text.size()) fail("unterminated string");
      const char c = text[i++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= text.size()) fail("bad escape");
      const char e = text[i++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u':
          if (i + 4 > text.size()) fail("bad \\u escape");
          out += static_cast<char>(std::strtol(text.substr(i, 4).c_str(), nullptr, 16));
          i += 4;
          break;
        default: fail("bad escape");
      }
    }
  };
  value = [&]() -> Json {
    skip();
    if (i >= text.size()) fail("unexpected end");
    const char c = text[i];
    if (c == '{') {
      ++i;
      auto object = std::make_shared<Json::Object>();
      skip();
      if (text[i] == '}') {
        ++i;
        return Json{object};
      }
      while (true) {
        skip();
        std::string key = string();
        skip();
        if (text[i++] != ':') fail("expected ':'");
        (*object)[key] = value();
        skip();
        if (text[i] == ',') {
          ++i;
          continue;
        }
        if (text[i++] != '}') fail("expected '}'");
        return Json{object};
      }
    }
    if (c == '[') {
      ++i;
      auto array = std::make_shared<Json::Array>();
      skip();
      if (text[i] == ']') {
        ++i;
        return Json{array};
      }
      while (true) {
        array->push_back(value());
        skip();
        if (text[i] == ',') {
          ++i;
          continue;
        }
        if (text[i++] != ']') fail("expected ']'");
        return Json{array};
      }
    }
    if (c == '"') return Json{string()};
    if (c == 't') return expect("true"), Json{true};
    if (c == 'f') return expect("false"), Json{false};
    if (c == 'n') return expect("null"), Json{nullptr};
    const char* begin = text.c_str() + i;
    char* end = nullptr;
    const double number = std::strtod(begin, &end);
    if (end == begin || !(c == '-' || std::isdigit(static_cast<unsigned char>(c)))) fail("bad value");
    i += static_cast<std::size_t>(end - begin);
    return Json{number};
  };
  Json result = value();
  skip();
  if (i != text.size()) fail("trailing text");
  return result;
}

// Parses RFC 4180 CSV (CRLF records, quoted fields); throws on malformed input.
inline std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '"') {
      ++i;
      while (true) {
        if (i >= text.size()) throw std::runtime_error("unterminated quoted field");
        if (text[i] == '"') {
          if (i + 1 < text.size() && text[i + 1] == '"') {
            field += '"';
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        field += text[i++];
      }
    }
    if (i >= text.size()) throw std::runtime_error("record without CRLF");
    if (text[i] == ',') {
      row.push_back(field);
      field.clear();
      ++i;
    } else if (text[i] == '\r') {
      if (i + 1 >= text.size() || text[i + 1] != '\n') throw std::runtime_error("CR without LF");
      row.push_back(field);
      field.clear();
      rows.push_back(row);
      row.clear();
      i += 2;
    } else if (text[i] == '"' || text[i] == '\n') {
      throw std::runtime_error("quote or LF inside an unquoted field");
    } else {
      field += text[i++];
    }
  }
  if (!row.empty() || !field.empty()) throw std::runtime_error("record without CRLF");
  return rows;
}

}  // namespace cachealloc::analyzer::testing
