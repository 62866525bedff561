// Where a tool writes: stdout for no -o or "-o -", else a file that is
// written beside its place and renamed there when complete, so a failed run
// leaves neither half a file nor the old one clobbered. An existing file is
// kept unless --force; every failure names the path and the OS reason.
//
// Nothing reaches stdout (or a pipe or device named by -o) before commit():
// the text goes to an unlinked temporary file, copied out when the run has
// succeeded, so an input refused half-way leaves no half-written JSON behind
// a pipe. The copy costs one pass over the output through the page cache;
// memory stays what the writer keeps.
#pragma once

#include <fstream>
#include <functional>
#include <memory>
#include <ostream>
#include <sstream>
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
  // Flushes, checks, renames into place (or copies the held text to stdout,
  // a pipe or a device). Throws UsageError with the OS reason. A second
  // call does nothing.
  void commit();
  // commit(), with `verify` called on the complete output before it takes
  // its place: `verify(path)` gets the path of the bytes written (the
  // temporary file beside -o), or "" when they are held for stdout, a pipe
  // or a device. When verify throws, nothing is renamed or copied out, the
  // temporary file is removed and the exception goes on; an old file stays.
  void commit(const std::function<void(const std::string& written)>& verify);

  // "-o DIR/" (a trailing slash, or an existing directory).
  static bool names_directory(const std::string& path);

 private:
  // Holds the text for stdout or a file that is not regular (`target_fd`).
  void hold(int target_fd);
  void copy_held();

  std::string path_;
  std::string temporary_;
  std::ofstream file_;
  bool committed_ = false;
  int target_fd_ = -1;   // where held text goes at commit(): stdout or the opened device
  int held_fd_ = -1;     // the unlinked temporary file, read back at commit()
  std::unique_ptr<std::ostringstream> held_in_memory_;  // when no temporary file could be made
};

}  // namespace cachealloc::cli
