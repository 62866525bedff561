#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cachealloc/snapshot/format.hpp"
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
      "A conversion to a pickle says on stderr what PyTorch's format has no place for.");
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
      std::vector<std::byte> bytes;
      if (target == "pickle") {
        const std::vector<std::string> losses = snapshot::pickle_conversion_losses(snapshot);
        bytes = snapshot::encode_pytorch_pickle(snapshot);
        if (!losses.empty()) {
          std::string list;
          for (const std::string& loss : losses) list += (list.empty() ? "" : "; ") + loss;
          std::fprintf(stderr, "%s: note: PyTorch's pickle has no place for: %s\n", kProgram, list.c_str());
        }
      } else {
        bytes = snapshot::encode(snapshot);
      }
      out.stream().write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }});
  });
}

}  // namespace cachealloc::cli
