#include "reports/category_sections.hpp"

namespace cachealloc::analyzer::detail {

std::size_t state_after(const Analysis& analysis, std::size_t event) {
  if (event != kNoEvent) return event;
  return analysis.window.begin == 0 ? kNoEvent : analysis.window.begin - 1;
}

std::vector<std::size_t> peak_and_end(const Analysis& analysis) {
  std::vector<std::size_t> moments = {state_after(analysis, analysis.peak_allocated.event),
                                      state_after(analysis, analysis.window.end - 1)};
  // kNoEvent (before the first event) first, as Categorization::at takes them.
  if (moments[1] == kNoEvent || (moments[0] != kNoEvent && moments[0] > moments[1])) std::swap(moments[0], moments[1]);
  return moments;
}

CategorizeOptions from_start_of(const Analysis& analysis) {
  CategorizeOptions options;
  options.start = analysis.start;
  return options;
}

std::shared_ptr<const Categorization> categories_of(EventSource& source, const Analysis& analysis,
                                                    const CategorizeOptions& options) {
  if (analysis.categories) return analysis.categories;
  return std::make_shared<const Categorization>(categorize(source, analysis.device, options));
}

std::string category_source(const Categorization& c) {
  if (c.any_exact() && c.any_inferred()) return "inferred and exact";
  return c.any_exact() ? "exact" : "inferred";
}

std::string category_source(const Categorization& c, Category category) {
  if (!c.inferred(category)) return "exact";
  return c.exact_in(category) != 0 ? "inferred and exact" : "inferred";
}

Table& add_category_table(Document& document, const std::string& key, const std::string& title,
                          const std::vector<Column>& columns, const std::vector<CategoryBytes>& figures,
                          const Categorization& categorization) {
  std::vector<Column> all = {{"category", "category"}};
  all.insert(all.end(), columns.begin(), columns.end());
  // Requested bytes only where some category is exact, which a program can
  // hold to its own sums (a guess has nothing to be held to): a trace
  // without category events prints what it always did.
  const bool with_requested = categorization.any_exact();
  if (with_requested) {
    for (const Column& column : columns)
      all.push_back({"requested_" + column.key, "requested " + column.title, column.unit});
  }
  all.push_back({"source", "source"});
  Table& table = document.table(key, title, std::move(all));
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    const auto category = static_cast<Category>(c);
    std::vector<Value> row = {std::string(category_key(category))};
    for (const CategoryBytes& f : figures) row.emplace_back(f.bytes[c]);
    if (with_requested)
      for (const CategoryBytes& f : figures) row.emplace_back(f.requested[c]);
    row.emplace_back(category_source(categorization, category));
    table.rows.push_back(std::move(row));
  }
  if (const std::size_t ignored = categorization.ignored_tags(); ignored != 0) {
    document.notes.push_back(std::to_string(ignored) +
                             " category event(s) named no live allocation of this device (or no category) and were "
                             "ignored.");
  }
  return table;
}

std::string category_note(const std::string& source) {
  if (source == "exact") return "categories: exact, as the program recorded them (category events).";
  if (source == "inferred and exact")
    return "categories: exact where the program recorded them (category events), else inferred from frames, "
           "annotations and lifetimes, a guess (docs/GLOSSARY.md says how); a row's source says which. They add up "
           "to allocated.";
  return "categories: inferred from frames, annotations (Optimizer.step, record_function) and lifetimes, a guess "
         "(docs/GLOSSARY.md says how); allocations nothing tells apart are 'other'. They add up to allocated.";
}

std::string category_peaks_note(const std::string& source) {
  if (source == "exact") return "exact: as the program recorded them (category events)";
  if (source == "inferred and exact")
    return "inferred and exact: as the program recorded them (category events) where it did, else from frames, "
           "annotations and lifetimes, a guess (docs/GLOSSARY.md); each peak names its category's source";
  return source + ": from frames, annotations and lifetimes, a guess (docs/GLOSSARY.md)";
}

}  // namespace cachealloc::analyzer::detail
