// Running a program of the build as a user would, for the tests that hold
// the CLI's conventions: no shell between (unless asked for), stdin, stdout
// and stderr as files, the exit status, and the child's own time and peak
// RSS from wait4.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace test_support {

struct ChildRun {
  int code = -1;  // the exit status; -1 when a signal ended it
  std::string out;
  std::string err;
  double seconds = 0;
  long max_rss_kib = 0;  // the peak RSS of the child and of what it waited for
  std::string first_err_line() const { return err.substr(0, err.find('\n')); }
};

struct ChildOptions {
  std::string input = "/dev/null";          // stdin
  std::filesystem::path cwd;                // empty: the test's own
  std::vector<std::string> environment;     // NAME=value pairs added
};

// A folder of this test process, made empty on first use.
inline std::filesystem::path scratch_folder(const std::string& tag) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("cachealloc-" + tag + "-" + std::to_string(::getpid()));
  static bool made = false;  // one tag per test binary
  if (!made) {
    std::filesystem::remove_all(dir);
    made = true;
  }
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs argv (argv[0] a path) with its output in files of `scratch`.
inline ChildRun run_child(std::vector<std::string> argv, const std::filesystem::path& scratch,
                          const ChildOptions& options = {}) {
  const std::filesystem::path out = scratch / "stdout", err = scratch / "stderr";
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!options.cwd.empty() && ::chdir(options.cwd.c_str()) != 0) ::_exit(126);
    const int in = ::open(options.input.c_str(), O_RDONLY);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(in, 0), ::dup2(o, 1), ::dup2(e, 2);
    for (const std::string& pair : options.environment) ::putenv(const_cast<char*>(pair.c_str()));
    std::vector<char*> pointers;
    for (std::string& a : argv) pointers.push_back(a.data());
    pointers.push_back(nullptr);
    ::execv(pointers[0], pointers.data());
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  ChildRun result;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.max_rss_kib = usage.ru_maxrss;
  result.out = slurp(out);
  result.err = slurp(err);
  return result;
}

}  // namespace test_support
