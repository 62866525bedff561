// peak and top as listings: bounded by default, the rest summed in one row
// that adds up, every row on request; one name for bytes allocated over the run.
#include <doctest/doctest.h>

#include <filesystem>
#include <limits>
#include <sstream>
#include <string>

#include "../analyzer/testing/parsers.hpp"
#include "cachealloc/analyzer/load.hpp"
#include "cachealloc/analyzer/reports.hpp"

using namespace cachealloc;
using analyzer::Document;
using analyzer::Table;

namespace {

const std::filesystem::path kPyTorch = std::filesystem::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "pytorch";

const Table& table_of(const Document& document, const std::string& key) {
  for (const auto& section : document.sections)
    if (const auto* table = std::get_if<Table>(&section); table && table->key == key) return *table;
  throw std::runtime_error("no table " + key);
}

std::uint64_t column_sum(const Table& table, std::size_t column) {
  std::uint64_t sum = 0;
  for (const auto& row : table.rows) sum += std::get<std::uint64_t>(row[column]);
  return sum;
}

std::string rendered(const Document& document, analyzer::Format format) {
  std::ostringstream out;
  analyzer::render(document, format, out);
  return out.str();
}

std::uint64_t field(const Document& document, const std::string& key) {
  for (const auto& section : document.sections)
    if (const auto* group = std::get_if<analyzer::FieldGroup>(&section))
      for (const auto& f : group->fields)
        if (f.key == key) return std::get<std::uint64_t>(f.value);
  throw std::runtime_error("no field " + key);
}

}  // namespace

TEST_CASE("peak lists the 20 largest allocations by default, the rest in one row that adds up, and all on request") {
  // given a transformer's training run with 126 allocations live at its peak
  const snapshot::Snapshot snap = analyzer::load(kPyTorch / "corpus" / "varlen_transformer.pickle");
  // when peak runs with its defaults
  const Document bounded = analyzer::peak_report(snap, {});
  const std::uint64_t live = field(bounded, "allocation_count");
  const std::uint64_t bytes = field(bounded, "allocated_bytes");
  REQUIRE(live > 100);
  // then 20 allocations are listed, and the rest row holds the others' count and bytes
  const Table& listed = table_of(bounded, "allocations");
  CHECK(listed.rows.size() == 20);
  REQUIRE(listed.rest);
  CHECK(listed.rest->count == live - 20);
  CHECK(column_sum(listed, 1) + std::get<std::uint64_t>(listed.rest->cells[1]) == bytes);
  // and in JSON the rest is an object of numbers
  const auto json = analyzer::testing::parse_json(rendered(bounded, analyzer::Format::json));
  CHECK(json["allocations_rest"]["rows"].number() == static_cast<double>(live - 20));
  CHECK(json["allocations_rest"]["size"].is_number());
  CHECK_FALSE(json["allocations_rest"].has("site"));
  // and the table prints it as a last row, whose address, which it has
  // none of (not an unknown figure), reads '-'
  const std::string table = rendered(bounded, analyzer::Format::table);
  const std::size_t rest_at = table.find("... and " + std::to_string(live - 20) + " more allocations");
  REQUIRE(rest_at != std::string::npos);
  const std::string rest_line = table.substr(table.rfind('\n', rest_at) + 1, rest_at - table.rfind('\n', rest_at) - 1);
  CHECK(rest_line.find("unknown") == std::string::npos);
  CHECK(rest_line.find(" - ") != std::string::npos);

  // when every allocation is asked for (--all)
  analyzer::ReportOptions all;
  all.limit = std::numeric_limits<std::size_t>::max();
  const Document everything = analyzer::peak_report(snap, all);
  // then each is listed and nothing is left over
  CHECK(table_of(everything, "allocations").rows.size() == live);
  CHECK_FALSE(table_of(everything, "allocations").rest);
  CHECK_FALSE(table_of(everything, "sites").rest);
}

TEST_CASE("peak's sites past the limit are summed in a rest row: K more sites, their bytes and share") {
  // given the CNN's peak, held by 5 sites
  const snapshot::Snapshot snap = analyzer::load(kPyTorch / "cnn_train_stacks_all.pickle");
  analyzer::ReportOptions options;
  options.limit = 2;
  // when only 2 are listed
  const Document peak = analyzer::peak_report(snap, options);
  const Table& sites = table_of(peak, "sites");
  REQUIRE(sites.rows.size() == 2);
  REQUIRE(sites.rest);
  // then the rest row counts the 3 others, and the listed and the rest add up to the peak's bytes
  CHECK(sites.rest->count == field(peak, "site_count") - 2);
  CHECK(column_sum(sites, 1) + std::get<std::uint64_t>(sites.rest->cells[1]) == field(peak, "allocated_bytes"));
  CHECK(std::get<std::string>(sites.rest->cells.back()) == "... and 3 more sites");
  // and CSV ends with it, its rank empty
  const std::string csv = rendered(peak, analyzer::Format::csv);
  const auto records = analyzer::testing::parse_csv(csv);
  REQUIRE(records.size() == 4);
  CHECK(records.back().front().empty());
  CHECK(records.back().back() == "... and 3 more sites");
}

TEST_CASE("top and export name the bytes allocated over the run allocated_over_run, never allocated") {
  const snapshot::Snapshot snap = analyzer::load(kPyTorch / "cnn_train_stacks_all.pickle");
  const Document top = analyzer::top_report(snap, {});
  const Table& sites = table_of(top, "sites");
  bool over_run = false;
  for (const auto& column : sites.columns) {
    CHECK(column.key != "bytes");
    CHECK(column.title != "allocated");
    over_run |= column.key == "allocated_over_run" && column.title == "allocated over run";
  }
  CHECK(over_run);
  CHECK(sites.title == "sites by bytes allocated over the run");
  const std::string csv = rendered(analyzer::export_report(snap, analyzer::ExportTable::sites, {}), analyzer::Format::csv);
  CHECK(csv.starts_with("rank,allocations,allocated_over_run,bytes_at_peak,"));
}

TEST_CASE("top on a trace whose ring overflowed marks its counts and bytes over the run as lower bounds, in the table "
          "and in JSON, as its note says; a complete trace marks none") {
  const snapshot::Snapshot cut = analyzer::load(kPyTorch / "ring_overflow.pickle");
  const Document top = analyzer::top_report(cut, {});
  const std::string table = rendered(top, analyzer::Format::table);
  CHECK(table.find(">= allocs") != std::string::npos);
  CHECK(table.find(">= allocated over run") != std::string::npos);
  CHECK(table.find("marked >=") != std::string::npos);
  const analyzer::testing::Json json = analyzer::testing::parse_json(rendered(top, analyzer::Format::json));
  std::vector<std::string> bounds;
  for (const auto& key : json["lower_bounds"].array()) bounds.push_back(std::get<std::string>(key.value));
  CHECK(bounds == std::vector<std::string>{"sites.allocations", "sites.allocated_over_run"});
  const snapshot::Snapshot whole = analyzer::load(kPyTorch / "cnn_train_stacks_all.pickle");
  const std::string whole_table = rendered(analyzer::top_report(whole, {}), analyzer::Format::table);
  CHECK(whole_table.find(">=") == std::string::npos);
  CHECK(analyzer::testing::parse_json(rendered(analyzer::top_report(whole, {}), analyzer::Format::json))["lower_bounds"]
            .array()
            .empty());
}
