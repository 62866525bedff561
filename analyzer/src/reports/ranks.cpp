// ranks FILE... | DIR: one summary per rank, made on a pool of threads, then
// the fleet's figures (imbalance, the rank closest to OOM, the sites whose
// bytes differ most between ranks).
#include <algorithm>
#include <atomic>
#include <cctype>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "cachealloc/analyzer/compare.hpp"
#include "cachealloc/snapshot/detail/cores.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "reports/category_sections.hpp"
#include "reports/report_helpers.hpp"

namespace cachealloc::analyzer {

namespace {

// Natural order: runs of digits compare as numbers ("rank_2" < "rank_10").
bool natural_less(const std::string& x, const std::string& y) {
  std::size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    const bool dx = std::isdigit(static_cast<unsigned char>(x[i])) != 0;
    const bool dy = std::isdigit(static_cast<unsigned char>(y[j])) != 0;
    if (dx && dy) {
      std::size_t ei = i, ej = j;
      while (ei < x.size() && std::isdigit(static_cast<unsigned char>(x[ei]))) ++ei;
      while (ej < y.size() && std::isdigit(static_cast<unsigned char>(y[ej]))) ++ej;
      std::size_t zi = i, zj = j;  // leading zeros do not count
      while (zi + 1 < ei && x[zi] == '0') ++zi;
      while (zj + 1 < ej && y[zj] == '0') ++zj;
      if (ei - zi != ej - zj) return ei - zi < ej - zj;
      const int order = x.compare(zi, ei - zi, y, zj, ej - zj);
      if (order != 0) return order < 0;
      i = ei;
      j = ej;
      continue;
    }
    if (x[i] != y[j]) return x[i] < y[j];
    ++i;
    ++j;
  }
  return x.size() - i < y.size() - j;
}

bool is_side_file(const std::filesystem::path& path) {
  // A compressed side file (run.stats.json.zst) is judged by the extension
  // under its compressor's.
  std::filesystem::path name = path.filename();
  std::string ext = name.extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".zst" || ext == ".gz") return is_side_file(name.stem());
  for (const char* skip : {".json", ".txt", ".log", ".csv", ".md", ".html", ".jsonl", ".py"})
    if (ext == skip) return true;
  return name.string().starts_with(".");
}

double median(std::vector<std::uint64_t> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? static_cast<double>(values[n / 2])
               : (static_cast<double>(values[n / 2 - 1]) + static_cast<double>(values[n / 2])) / 2.0;
}

// What the rank could still have reserved: to its cap where its OOMs
// recorded one, else to the device total.
std::optional<std::uint64_t> headroom(const RunSummary& run) {
  std::optional<std::uint64_t> limit = run.device_total;
  if (run.cap) limit = std::min(limit.value_or(*run.cap), *run.cap);
  if (!limit) return std::nullopt;
  return *limit > run.peak_reserved ? *limit - run.peak_reserved : 0;
}

// "2", "#3" (no rank in the name), or "2/device 1" where the file holds
// several devices.
std::string rank_label(const std::vector<RankSummary>& ranks, std::size_t index) {
  const RankSummary& r = ranks[index];
  std::string label = r.rank ? std::to_string(*r.rank) : "#" + std::to_string(index);
  const auto same_file = [&](const RankSummary& other) { return other.run.file == r.run.file; };
  if (std::count_if(ranks.begin(), ranks.end(), same_file) > 1) label += "/device " + std::to_string(r.run.device);
  return label;
}

// Sites across ranks: bytes at each rank's allocated peak (0 where absent).
struct SiteSpread {
  const std::vector<std::string>* frames = nullptr;
  std::vector<std::uint64_t> bytes;  // per rank
  std::uint64_t min = 0, max = 0;
  std::size_t min_rank = 0, max_rank = 0;
};

std::vector<SiteSpread> site_spreads(const std::vector<RankSummary>& ranks) {
  std::map<std::vector<std::string>, SiteSpread> by_frames;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].readable()) continue;
    for (const SiteSummary& s : ranks[r].run.sites) {
      SiteSpread& spread = by_frames[s.frames];
      if (!spread.frames) {
        spread.frames = &s.frames;
        spread.bytes.assign(ranks.size(), 0);
      }
      spread.bytes[r] += s.bytes_at_peak;
    }
  }
  std::vector<SiteSpread> result;
  for (auto& [frames, spread] : by_frames) {
    // Over the files that could be read: an unreadable one has no figure.
    std::vector<std::uint64_t> readable;
    bool first = true;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      if (!ranks[r].readable()) continue;
      const std::uint64_t bytes = spread.bytes[r];
      readable.push_back(bytes);
      if (first || bytes < spread.min) spread.min = bytes, spread.min_rank = r;
      if (first || bytes > spread.max) spread.max = bytes, spread.max_rank = r;
      first = false;
    }
    spread.bytes = std::move(readable);
    if (spread.max != spread.min) result.push_back(std::move(spread));
  }
  std::stable_sort(result.begin(), result.end(), [](const SiteSpread& x, const SiteSpread& y) {
    return x.max - x.min > y.max - y.min;
  });
  return result;
}

}  // namespace

std::optional<std::uint32_t> rank_from_name(const std::string& file_name) {
  std::string name = file_name;
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto number_at = [&](std::size_t at) -> std::optional<std::uint32_t> {
    while (at < name.size() && (name[at] == '_' || name[at] == '-' || name[at] == '.' || name[at] == ':')) ++at;
    std::size_t end = at;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end])) && end - at < 9) ++end;
    if (end == at) return std::nullopt;
    return static_cast<std::uint32_t>(std::stoul(name.substr(at, end - at)));
  };
  for (const char* word : {"rank", "gpu", "device", "cuda"}) {
    for (std::size_t at = name.find(word); at != std::string::npos; at = name.find(word, at + 1))
      if (const auto n = number_at(at + std::string_view(word).size())) return n;
  }
  // The name's only number (extensions and compression suffixes aside).
  std::optional<std::uint32_t> only;
  std::size_t numbers = 0;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i])) || (i > 0 && std::isdigit(static_cast<unsigned char>(name[i - 1]))))
      continue;
    ++numbers;
    only = number_at(i);
  }
  return numbers == 1 ? only : std::nullopt;
}

std::vector<std::filesystem::path> rank_files(const std::vector<std::string>& arguments) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const std::string& argument : arguments) {
    std::error_code error;
    const fs::path path(argument);
    if (fs::is_directory(path, error)) {
      std::vector<fs::path> inside;
      for (fs::directory_iterator it(path, error), end; !error && it != end; it.increment(error)) {
        std::error_code kind;
        if (it->is_regular_file(kind) && !is_side_file(it->path())) inside.push_back(it->path());
      }
      if (error) throw std::invalid_argument(argument + ": cannot list the folder: " + error.message());
      if (inside.empty())
        throw std::invalid_argument(argument + ": the folder holds no snapshot (a .pickle, .bin or any file that is not "
                                    ".json, .txt, .log, .csv, .md or .html)");
      files.insert(files.end(), inside.begin(), inside.end());
    } else if (fs::exists(path, error) || argument == "-") {
      files.push_back(path);
    } else {
      throw std::invalid_argument(argument + ": no such file or folder");
    }
  }
  std::stable_sort(files.begin(), files.end(), [](const fs::path& x, const fs::path& y) {
    const std::string nx = x.filename().string(), ny = y.filename().string();
    if (natural_less(nx, ny)) return true;
    if (natural_less(ny, nx)) return false;
    return natural_less(x.string(), y.string());
  });
  return files;
}

namespace {

// The devices a file's head names: its device table and its segments. Empty
// for a trace that names none (pick_device() then finds the first).
std::vector<std::int32_t> devices_in(const snapshot::Snapshot& head) {
  std::set<std::int32_t> devices;
  for (const snapshot::DeviceInfo& device : head.devices) devices.insert(device.index);
  for (const snapshot::Segment& segment : head.segments) devices.insert(segment.device);
  return {devices.begin(), devices.end()};
}

std::string device_list(const std::vector<std::int32_t>& devices) {
  std::string text;
  for (const std::int32_t d : devices) text += (text.empty() ? "" : ", ") + std::to_string(d);
  return text;
}

// One file's rows: one per device it holds, or the one --device names.
std::vector<RankSummary> summarize_file(const std::filesystem::path& file, const RanksOptions& options) {
  FileEvents source(file, options.decode_threads);
  const std::vector<std::int32_t> present = devices_in(source.head());
  std::vector<std::int32_t> devices = present;
  if (options.summary.device >= 0) {
    if (!present.empty() && std::find(present.begin(), present.end(), options.summary.device) == present.end())
      throw std::invalid_argument("--device " + std::to_string(options.summary.device) + " is not in it (devices: " +
                                  device_list(present) + ")");
    devices = {options.summary.device};
  }
  if (devices.empty()) devices = {-1};
  std::vector<RankSummary> rows;
  for (const std::int32_t device : devices) {
    SummaryOptions one = options.summary;
    one.device = device;
    RankSummary& row = rows.emplace_back();
    row.run = summarize(source, one);
    row.run.file = file.string();
    row.rank = rank_from_name(file.filename().string());
  }
  return rows;
}

}  // namespace

std::vector<RankSummary> summarize_ranks(const std::vector<std::filesystem::path>& files, const RanksOptions& options) {
  std::vector<std::vector<RankSummary>> per_file(files.size());
  unsigned threads = options.threads != 0 ? options.threads : snapshot::detail::usable_cores();
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, std::max<std::size_t>(files.size(), 1)));
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> done{0};
  std::mutex progress_lock;
  auto work = [&] {
    for (std::size_t i = next++; i < files.size(); i = next++) {
      std::string error;
      try {
        // One file open per thread: its replay state lives only inside summarize().
        per_file[i] = summarize_file(files[i], options);
      } catch (const snapshot::SnapshotError& e) {
        // An I/O error names the path already.
        error = e.code() == snapshot::ErrorCode::io ? e.what() : "cannot read " + files[i].string() + ": " + e.what();
      } catch (const std::exception& e) {
        error = "cannot read " + files[i].string() + ": " + e.what();
      }
      if (!error.empty()) {
        RankSummary& row = per_file[i].emplace_back();
        row.run.file = files[i].string();
        row.rank = rank_from_name(files[i].filename().string());
        row.error = std::move(error);
      }
      const std::size_t finished = ++done;
      if (options.progress) {
        const std::lock_guard<std::mutex> hold(progress_lock);
        options.progress(finished, files.size());
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
  std::vector<RankSummary> ranks;
  for (std::vector<RankSummary>& rows : per_file)
    for (RankSummary& row : rows) ranks.push_back(std::move(row));
  // A number two files' names both give ("s200k_a.bin", "s200k_b.bin") names
  // neither: their ranks are unknown rather than one rank twice.
  std::map<std::uint32_t, std::set<std::string>> files_of;
  for (const RankSummary& r : ranks)
    if (r.rank) files_of[*r.rank].insert(r.run.file);
  for (RankSummary& r : ranks) {
    if (r.rank && files_of[*r.rank].size() > 1) {
      r.rank.reset();
      r.rank_shared = true;
    }
  }
  return ranks;
}

RanksFigures ranks_figures(const std::vector<RankSummary>& ranks) {
  RanksFigures f;
  std::vector<std::uint64_t> reserved, allocated;
  for (const RankSummary& r : ranks) {
    if (!r.readable()) continue;
    reserved.push_back(r.run.peak_reserved);
    allocated.push_back(r.run.peak_allocated);
  }
  f.median_peak_reserved = median(reserved);
  f.median_peak_allocated = median(allocated);
  if (!reserved.empty()) {
    const double max_reserved = static_cast<double>(*std::max_element(reserved.begin(), reserved.end()));
    const double max_allocated = static_cast<double>(*std::max_element(allocated.begin(), allocated.end()));
    f.imbalance_reserved = f.median_peak_reserved > 0 ? max_reserved / f.median_peak_reserved : 0;
    f.imbalance_allocated = f.median_peak_allocated > 0 ? max_allocated / f.median_peak_allocated : 0;
  }
  // By headroom where every rank's device total is known; else by peak reserved.
  f.headroom_known = !reserved.empty() && std::all_of(ranks.begin(), ranks.end(), [](const RankSummary& r) {
    return !r.readable() || r.run.device_total.has_value() || r.run.cap.has_value();
  });
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (!ranks[i].readable()) continue;
    if (!f.closest_to_oom) {
      f.closest_to_oom = i;
      continue;
    }
    const RunSummary& best = ranks[*f.closest_to_oom].run;
    const RunSummary& run = ranks[i].run;
    const bool closer = f.headroom_known ? *headroom(run) < *headroom(best) : run.peak_reserved > best.peak_reserved;
    if (closer) f.closest_to_oom = i;
  }
  return f;
}

Document ranks_report(const std::vector<RankSummary>& ranks, const RanksOptions& options) {
  const RanksFigures f = ranks_figures(ranks);
  Document doc;
  doc.report = "ranks";
  std::size_t unreadable = 0;
  for (const RankSummary& r : ranks) unreadable += r.readable() ? 0 : 1;
  const std::size_t readable = ranks.size() - unreadable;
  doc.title = "ranks: " + std::to_string(readable) + " snapshot(s)" +
              (unreadable != 0 ? ", " + std::to_string(unreadable) + " file(s) unreadable" : "");
  doc.csv_table = "ranks";
  bool bounds = false, approximate = false;
  for (const RankSummary& r : ranks) {
    bounds = bounds || r.run.lower_bounds;
    approximate = approximate || r.run.approximate;
  }
  // The medians are marked once: approximate where any rank's figures are
  // (a median over approximate figures is itself neither exact nor a bound).
  doc.approximate = approximate;
  FieldGroup& fleet = doc.group("", "over all ranks");
  // Not "ranks": that key is the table's in JSON.
  fleet.add("rank_count", "ranks", static_cast<std::uint64_t>(readable), Unit::count)
      .add("unreadable_files", "unreadable files", static_cast<std::uint64_t>(unreadable), Unit::count)
      .add("median_peak_reserved", "median peak reserved", static_cast<std::uint64_t>(f.median_peak_reserved),
           Unit::bytes, bounds || approximate)
      .add("imbalance_reserved", "imbalance of peak reserved (max / median)", f.imbalance_reserved)
      .add("median_peak_allocated", "median peak allocated", static_cast<std::uint64_t>(f.median_peak_allocated),
           Unit::bytes, bounds || approximate)
      .add("imbalance_allocated", "imbalance of peak allocated (max / median)", f.imbalance_allocated);
  if (f.closest_to_oom) {
    const RankSummary& c = ranks[*f.closest_to_oom];
    const std::optional<std::uint64_t> room = headroom(c.run);
    // A file name without a rank number: its rank is unknown, as in the table.
    fleet.add("closest_to_oom_rank", "closest to OOM: rank", c.rank ? Value{static_cast<std::uint64_t>(*c.rank)} : Value{})
        .absent_as("unknown")
        .add("closest_to_oom_file", "closest to OOM: file", c.run.file)
        .add("closest_to_oom_headroom", "its headroom (cap or device total - peak reserved)",
             room ? Value{*room} : Value{}, Unit::bytes);
  }
  Table& table = doc.table("ranks", "per rank, in rank order",
                           {{"rank", "rank", Unit::count},
                            {"file", "file"},
                            {"device", "device", Unit::count},
                            {"peak_reserved", "peak reserved", Unit::bytes},
                            {"peak_allocated", "peak allocated", Unit::bytes},
                            {"peak_reserved_vs_median", "vs median", Unit::ratio},
                            {"driver_total", "device total", Unit::bytes},
                            {"cap", "cap", Unit::bytes, "none"},
                            {"headroom", "headroom", Unit::bytes},
                            {"segments", "segments", Unit::count},
                            {"ooms", "OOMs", Unit::count},
                            {"closest_to_oom", "closest"},
                            {"lower_bounds", "lower bounds"},
                            {"approximate", "approximate"},
                            {"unreadable", "unreadable"}});
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RunSummary& run = ranks[i].run;
    const Value rank = ranks[i].rank ? Value{static_cast<std::uint64_t>(*ranks[i].rank)} : Value{};
    const std::string file = std::filesystem::path(run.file).filename().string();
    if (!ranks[i].readable()) {
      // Marked, not left out: every figure unknown; the reason is in the notes.
      std::vector<Value> row(table.columns.size());
      row[0] = rank;
      row[1] = file;
      row.back() = true;
      table.rows.push_back(std::move(row));
      doc.notes.push_back("unreadable: " + ranks[i].error);
      continue;
    }
    const std::optional<std::uint64_t> room = headroom(run);
    table.rows.push_back({ranks[i].rank ? Value{static_cast<std::uint64_t>(*ranks[i].rank)} : Value{},
                          file, static_cast<std::uint64_t>(run.device),
                          run.peak_reserved, run.peak_allocated,
                          f.median_peak_reserved > 0 ? Value{static_cast<double>(run.peak_reserved) / f.median_peak_reserved}
                                                     : Value{},
                          run.device_total ? Value{*run.device_total} : Value{}, run.cap ? Value{*run.cap} : Value{},
                          room ? Value{*room} : Value{},
                          run.peak_segments, run.ooms, f.closest_to_oom == i, run.lower_bounds,
                          run.approximate, false});
  }
  // What each rank's allocated peak is made of.
  std::vector<Column> category_columns = {{"rank", "rank", Unit::count}, {"file", "file"}};
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    const char* key = category_key(static_cast<Category>(c));
    category_columns.push_back({key, key, Unit::bytes});
  }
  category_columns.push_back({"source", "source"});
  Table& categories = doc.table("categories", "per rank, the categories at its allocated peak", std::move(category_columns));
  std::string category_source;
  for (const RankSummary& r : ranks) {
    std::vector<Value> row(1);
    if (r.rank) row[0] = static_cast<std::uint64_t>(*r.rank);
    row.emplace_back(std::filesystem::path(r.run.file).filename().string());
    if (r.readable()) {
      for (const std::uint64_t bytes : r.run.categories_at_peak.bytes) row.emplace_back(bytes);
      row.emplace_back(r.run.category_source);
    } else {
      row.resize(categories.columns.size());  // unreadable: every figure unknown
    }
    categories.rows.push_back(std::move(row));
    if (r.readable() && category_source.empty()) category_source = r.run.category_source;
  }
  if (!category_source.empty()) doc.notes.push_back(detail::category_note(category_source));
  const std::vector<SiteSpread> spreads = site_spreads(ranks);
  Table& sites = doc.table("sites", "sites whose bytes at the allocated peak differ most between ranks",
                           {{"spread", "max - min", Unit::bytes},
                            {"min_bytes", "min", Unit::bytes},
                            {"min_rank", "on rank"},
                            {"max_bytes", "max", Unit::bytes},
                            {"max_rank", "on rank"},
                            {"median_bytes", "median", Unit::bytes},
                            {"stack", "site"}});
  for (std::size_t i = 0; i < detail::listed(spreads.size(), options.site_limit); ++i) {
    const SiteSpread& s = spreads[i];
    sites.rows.push_back({s.max - s.min, s.min, rank_label(ranks, s.min_rank), s.max,
                          rank_label(ranks, s.max_rank), static_cast<std::uint64_t>(median(s.bytes)),
                          *s.frames});
  }
  if (!f.headroom_known) {
    doc.notes.push_back(
        "headroom: unknown for the ranks whose file records no device total (PyTorch's pickles record none) and "
        "whose OOMs recorded no cap; the "
        "rank closest to OOM is then the one with the largest peak reserved.");
  } else {
    doc.notes.push_back("headroom is the cap (a memory fraction, as the rank's OOMs recorded it) or else the device "
                        "total, less the peak reserved: the CUDA context and other processes take some of the device.");
  }
  if (bounds) doc.notes.push_back("some traces do not cover their whole run: their peaks are lower bounds.");
  if (approximate)
    doc.notes.push_back("some streams dropped events while they were written (when_full was drop): their peaks are "
                        "approximate, neither exact nor bounds.");
  // Counted by file: a file of several devices is one name.
  std::set<std::string> unnamed, shared;
  for (const RankSummary& r : ranks)
    if (!r.rank) (r.rank_shared ? shared : unnamed).insert(r.run.file);
  if (!shared.empty())
    doc.notes.push_back(std::to_string(shared.size()) +
                        " file names give a rank number another file's name gives too: their ranks are unknown "
                        "(null in JSON); the sites table names each #N, its row in rank order from 0.");
  if (!unnamed.empty())
    doc.notes.push_back(unnamed.size() == 1
                            ? "1 file name carries no rank number (rank_N, gpuN, deviceN): its rank is unknown (null "
                              "in JSON); the sites table names it #N, its row in rank order from 0."
                            : std::to_string(unnamed.size()) +
                                  " file names carry no rank number (rank_N, gpuN, deviceN): their ranks are unknown "
                                  "(null in JSON); the sites table names each #N, its row in rank order from 0.");
  if (options.site_limit != 0 && spreads.size() > options.site_limit)
    doc.notes.push_back(std::to_string(spreads.size() - options.site_limit) + " more sites differ (--limit)");
  return doc;
}

void write_ranks_jsonl(const std::vector<RankSummary>& ranks, const RanksOptions& options, std::ostream& out) {
  const RanksFigures f = ranks_figures(ranks);
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RunSummary& run = ranks[i].run;
    JsonWriter json(out);
    json.begin_object();
    json.key("rank");
    if (ranks[i].rank) json.value(static_cast<std::uint64_t>(*ranks[i].rank));
    else json.null();
    json.key("position");
    json.value(static_cast<std::uint64_t>(i));
    json.key("file");
    json.value(run.file);
    json.key("error");
    if (ranks[i].readable()) {
      json.null();
    } else {
      json.value(ranks[i].error);  // an unreadable file: no figures
      json.end_object();
      out << '\n';
      continue;
    }
    json.key("program");
    json.value(run.program);
    json.key("device");
    json.value(static_cast<std::int64_t>(run.device));
    json.key("peak_reserved");
    json.value(run.peak_reserved);
    json.key("peak_allocated");
    json.value(run.peak_allocated);
    json.key("categories_at_peak_allocated");
    json.begin_object();
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      json.key(category_key(static_cast<Category>(c)));
      json.value(run.categories_at_peak.bytes[c]);
    }
    json.end_object();
    json.key("category_source");
    json.value(run.category_source);
    json.key("peak_reserved_vs_median");
    if (f.median_peak_reserved > 0) json.value(static_cast<double>(run.peak_reserved) / f.median_peak_reserved);
    else json.null();
    json.key("driver_total");
    if (run.device_total) json.value(*run.device_total);
    else json.null();
    json.key("cap");
    if (run.cap) json.value(*run.cap);
    else json.null();
    json.key("headroom");
    if (const auto room = headroom(run)) json.value(*room);
    else json.null();
    json.key("segments");
    json.value(run.peak_segments);
    json.key("ooms");
    json.value(run.ooms);
    json.key("closest_to_oom");
    json.value(f.closest_to_oom == i);
    json.key("lower_bounds");
    json.value(run.lower_bounds);
    json.key("approximate");
    json.value(run.approximate);
    json.key("top_sites");
    json.begin_array();
    for (std::size_t s = 0; s < detail::listed(run.sites.size(), options.site_limit); ++s) {
      if (run.sites[s].bytes_at_peak == 0) break;
      json.begin_object();
      json.key("bytes_at_peak");
      json.value(run.sites[s].bytes_at_peak);
      json.key("site");
      json.value(run.sites[s].frames.front());
      json.end_object();
    }
    json.end_array();
    json.end_object();
    out << '\n';
  }
}

}  // namespace cachealloc::analyzer
