#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cachealloc/analyzer/event_source.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/load.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "command.hpp"

namespace cachealloc::cli {

namespace {

// "pickle" or "ours" from -o's extension, in any case; "" when unknown.
std::string format_of(const std::string& path) {
  std::string extension = std::filesystem::path(path).extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (extension == ".pickle" || extension == ".pkl") return "pickle";
  if (extension == ".bin" || extension == ".snap" || extension == ".casnap") return "ours";
  return {};
}

// What PyTorch's pickle holds that our format has no place for: the reader
// keeps neither a trace entry's compile_context and user_metadata nor the
// size a cached (inactive) block was last requested with.
std::vector<std::string> ours_conversion_losses(const snapshot::Snapshot& snapshot) {
  if (snapshot.header.source != snapshot::kPytorchPickleSource) return {};
  return {"the trace entries' compile_context and user_metadata",
          "the requested_size PyTorch leaves on inactive (cached) blocks"};
}

void note_losses(const char* format, const std::vector<std::string>& losses) {
  if (losses.empty()) return;
  std::string list;
  for (const std::string& loss : losses) list += (list.empty() ? "" : "; ") + loss;
  std::fprintf(stderr, "%s: note: %s has no place for: %s\n", kProgram, format, list.c_str());
}

// The events a reader of the written file must find: a pickle has no
// split, merge or empty_cache entries (pickle_conversion_losses lists them).
std::size_t events_written(const snapshot::Snapshot& snapshot, bool pickle) {
  if (!pickle) return snapshot.events.size();
  using snapshot::EventKind;
  return static_cast<std::size_t>(std::count_if(snapshot.events.begin(), snapshot.events.end(), [](const auto& e) {
    return e.kind != EventKind::split && e.kind != EventKind::merge && e.kind != EventKind::empty_cache &&
           e.kind != EventKind::category;
  }));
}

// Reads the written bytes back with the reader every analysis uses (the
// file itself where it can be read again, else the bytes in memory) and
// holds them to what was written: every event block decoded, the counts of
// events and segments equal. Throws UsageError: the output is then removed.
void read_back(const std::string& written, const std::vector<std::byte>& bytes, const snapshot::Snapshot& from,
               bool pickle) {
  std::size_t events = 0, segments = 0;
  try {
    if (written.empty()) {
      const snapshot::Snapshot back = snapshot::load(std::span<const std::byte>(bytes));
      events = back.events.size();
      segments = back.segments.size();
    } else {
      analyzer::FileEvents back(written, 0);
      for (std::size_t b = 0; b < back.block_count(); ++b) events += back.block(b).size();
      segments = back.head().segments.size();
    }
  } catch (const snapshot::SnapshotError& error) {
    throw UsageError(std::string("convert: the output does not read back (") + error.what() + "); nothing written");
  }
  const std::size_t expected = events_written(from, pickle);
  if (events != expected || segments != from.segments.size())
    throw UsageError("convert: the output reads back as " + std::to_string(events) + " events and " +
                     std::to_string(segments) + " segments, not " + std::to_string(expected) + " and " +
                     std::to_string(from.segments.size()) + "; nothing written");
}

}  // namespace

void add_convert_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand(
      "convert", "Write the snapshot as a PyTorch memory-snapshot pickle (for _memory_viz) or in our format");
  command->add_option("FILE", runner.common.file,
                      "snapshot to read (ours or a PyTorch pickle, compressed or not; - : standard input)")
      ->required();
  command->add_option("-o,--output", runner.common.output,
                      "file to write (- : stdout); .pickle/.pkl is a pickle, .bin/.snap/.casnap ours")
      ->required();
  command->add_flag("-f,--force", runner.common.force, "overwrite the -o file if it exists");
  add_input_options(*command, runner.common);
  auto to = std::make_shared<std::string>();
  command->add_option("--to-format", *to, "ours or pickle (default: from -o's extension)")
      ->check(one_of({"ours", "pickle"}));
  add_version_flags(*command, std::string(kProgram) + " " CACHEALLOC_VERSION);
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze convert run.bin -o run.pickle && python -m torch.cuda._memory_viz trace_plot run.pickle\n"
      "  cachealloc-analyze convert torch_snapshot.pickle.gz -o run.bin\n"
      "  cachealloc-analyze convert run.bin -o - --to-format pickle | ssh host 'cat > run.pickle'\n"
      "A conversion says on stderr what the other format has no place for. The output is read back with the\n"
      "reader every analysis uses before it takes its place; when it does not read back, nothing is written\n"
      "(exit 2).");
  command->callback([&runner, to] {
    // Decided before the input is read: a bad -o costs nothing.
    const std::string output = runner.common.output;
    std::string target = *to;
    if (target.empty()) {
      target = output == "-" ? std::string() : format_of(output);
      if (target.empty()) {
        const std::string extension = output == "-" ? "" : std::filesystem::path(output).extension().string();
        throw UsageError("-o " + output + ": cannot tell the format from " +
                         (extension.empty() ? std::string("a name without an extension") : "'" + extension + "'") +
                         " (.pickle, .pkl: pickle; .bin, .snap, .casnap: ours); add --to-format ours|pickle");
      }
    }
    runner.select("convert", SnapshotJob{[target](const snapshot::Snapshot& snapshot, Output& out) {
      const bool pickle = target == "pickle";
      const std::vector<std::byte> bytes = pickle ? snapshot::encode_pytorch_pickle(snapshot) : snapshot::encode(snapshot);
      out.stream().write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      out.commit([&](const std::string& written) { read_back(written, bytes, snapshot, pickle); });
      if (pickle) note_losses("PyTorch's pickle", snapshot::pickle_conversion_losses(snapshot));
      else note_losses("our format", ours_conversion_losses(snapshot));
    }});
  });
}

}  // namespace cachealloc::cli
