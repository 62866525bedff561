#include <filesystem>

#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/pickle.hpp"
#include "command.hpp"

namespace cachealloc::cli {

void add_convert_command(CLI::App& app, Runner& runner) {
  CLI::App* command = app.add_subcommand(
      "convert", "Write the snapshot as a PyTorch memory-snapshot pickle (for _memory_viz) or in our format");
  command->add_option("file", runner.common.file, "snapshot to read (ours or a PyTorch pickle)")->required();
  command->add_option("-o,--output", runner.common.output, "file to write: .pickle for PyTorch, else our format")
      ->required();
  auto to = std::make_shared<std::string>("auto");
  command->add_option("--to", *to, "output format: auto (by -o's extension), pickle or cachealloc")
      ->check(CLI::IsMember({"auto", "pickle", "cachealloc"}));
  command->footer(
      "Examples:\n"
      "  cachealloc-analyze convert run.bin -o run.pickle && python -m torch.cuda._memory_viz trace_plot run.pickle\n"
      "  cachealloc-analyze convert torch_snapshot.pickle -o run.bin");
  command->callback([&runner, to] {
    runner.select_action("convert", [&runner, to](const snapshot::Snapshot& snapshot) {
      const std::filesystem::path out = runner.common.output;
      const bool pickle = *to == "pickle" || (*to == "auto" && out.extension() == ".pickle");
      if (pickle)
        snapshot::write_pytorch_pickle(snapshot, out);
      else
        snapshot::write_snapshot(snapshot, out);
    });
  });
}

}  // namespace cachealloc::cli
