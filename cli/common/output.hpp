// Where a tool writes: stdout for no -o or "-o -", else a file that is
// written beside its place and renamed there when complete, so a failed run
// leaves neither half a file nor the old one clobbered. An existing file is
// kept unless --force; every failure names the path and the OS reason.
#pragma once

#include <fstream>
#include <ostream>
#include <string>

namespace cachealloc::cli {

class Output {
 public:
  // `path`: "" or "-" for stdout. Throws UsageError when the file exists and
  // !force ("-o x.csv: x.csv exists; add -f/--force to overwrite it"), or
  // when its folder cannot take a file ("cannot write x.csv: No such file or
  // directory").
  Output(std::string path, bool force);
  ~Output();
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;
  std::ostream& stream();
  bool to_stdout() const noexcept { return path_.empty(); }
  const std::string& path() const noexcept { return path_; }
  // Flushes, checks, renames into place. Throws UsageError with the OS reason.
  void commit();

  // "-o DIR/" (a trailing slash, or an existing directory).
  static bool names_directory(const std::string& path);

 private:
  std::string path_;
  std::string temporary_;
  std::ofstream file_;
  bool committed_ = false;
};

}  // namespace cachealloc::cli
