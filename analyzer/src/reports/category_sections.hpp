// The categories (categories.hpp) as reports print them: one row per
// category, its bytes at the moments the report describes, and where the
// category came from. Private to analyzer/src/reports.
#pragma once

#include <string>
#include <vector>

#include "cachealloc/analyzer/categories.hpp"
#include "cachealloc/analyzer/document.hpp"

namespace cachealloc::analyzer::detail {

// The event after which a state holds, for Categorization::at: a peak at
// the window's start (kNoEvent) is the state before the window's first event.
std::size_t state_after(const Analysis& analysis, std::size_t event);

// The states after the allocated peak and after the window's last event:
// the moments summary and diff describe, in order, for
// CategorizeOptions::moments and Categorization::at.
std::vector<std::size_t> peak_and_end(const Analysis& analysis);

// Categorizes from the start `analysis` confirmed, rather than finding it
// again with a replay of every event.
CategorizeOptions from_start_of(const Analysis& analysis);

// The categories `analysis` took in its own pass (AnalysisOptions::categories),
// else categorize() with `options` (a window, several threads): one read of
// the events more.
std::shared_ptr<const Categorization> categories_of(EventSource& source, const Analysis& analysis,
                                                    const CategorizeOptions& options);

// "inferred", "exact", or "inferred and exact" where both occur.
std::string category_source(const Categorization& categorization);
// The same for one category: "exact" where every allocation of it is
// (Categorization::inferred), "inferred" where none is.
std::string category_source(const Categorization& categorization, Category category);

// A table `key`: a row per category, its key, one cell per column from
// `figures` (one CategoryBytes per column), where any category is exact
// the requested bytes of each figure ("requested_<column>"), then the
// category's source; a note counts the category events ignored, if any.
Table& add_category_table(Document& document, const std::string& key, const std::string& title,
                          const std::vector<Column>& columns, const std::vector<CategoryBytes>& figures,
                          const Categorization& categorization);

// The note every report with categories carries, for categories of `source`
// (category_source()).
std::string category_note(const std::string& source);

// The same, for check's note on the categories' peaks: the source, then
// what it means ("inferred: from frames, ...").
std::string category_peaks_note(const std::string& source);

}  // namespace cachealloc::analyzer::detail
