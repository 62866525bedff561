// The benchmarks' command lines. A count is decimal digits only, within its
// bounds ("5x", "-1" and "" are refused, where atol took 5, a huge unsigned
// or 0 and the benchmark then printed inf and nan). -h or --help anywhere
// prints the usage on stdout and exits 0; any other mistake prints one line
// naming it on stderr and exits 2. guarded() does the same
// (guarded.hpp) for errors found while running.
#pragma once

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace cachealloc::bench {

// `text` as a whole number in [min, max]; nullopt for anything else.
inline std::optional<unsigned long long> parse_count(std::string_view text, unsigned long long min,
                                                     unsigned long long max) {
  unsigned long long value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size() || value < min || value > max)
    return std::nullopt;
  return value;
}

class Args {
 public:
  // `usage`: the arguments after the program's name, e.g. "[steps] [passes]".
  Args(int argc, char** argv, std::string usage, int max_positional)
      : argc_(argc), argv_(argv), name_(program_name(argv[0])), usage_(std::move(usage)) {
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg == "-h" || arg == "--help") {
        std::printf("usage: %s %s\n", name_.c_str(), usage_.c_str());
        std::exit(0);
      }
    }
    if (argc - 1 > max_positional)
      fail("expected at most " + std::to_string(max_positional) + " arguments, got " + std::to_string(argc - 1));
  }

  bool has(int index) const noexcept { return index < argc_; }
  const char* operator[](int index) const noexcept { return argv_[index]; }

  // argv[index] as a count in [min, max], or `fallback` when it is absent.
  template <typename T>
  T count(int index, T fallback, T min, T max, const char* what) const {
    if (!has(index)) return fallback;
    const auto value = parse_count(argv_[index], static_cast<unsigned long long>(min),
                                   static_cast<unsigned long long>(max));
    if (!value)
      fail(std::string(what) + " must be a whole number from " + std::to_string(min) + " to " + std::to_string(max) +
           ", not '" + argv_[index] + "'");
    return static_cast<T>(*value);
  }

  // argv[index], which must be one of `allowed`, or `fallback` when absent.
  std::string word(int index, std::string fallback, std::initializer_list<std::string_view> allowed,
                   const char* what) const {
    if (!has(index)) return fallback;
    for (std::string_view option : allowed)
      if (option == argv_[index]) return argv_[index];
    std::string list;
    for (std::string_view option : allowed) list += (list.empty() ? "" : ", ") + std::string(option);
    fail(std::string(what) + " must be one of " + list + ", not '" + argv_[index] + "'");
  }

  [[noreturn]] void fail(const std::string& why) const {
    std::fprintf(stderr, "%s: error: %s (see --help)\n", name_.c_str(), why.c_str());
    std::exit(2);
  }

  const std::string& name() const noexcept { return name_; }

 private:
  static std::string program_name(const char* path) { return std::filesystem::path(path).filename().string(); }

  int argc_;
  char** argv_;
  std::string name_;
  std::string usage_;
};

}  // namespace cachealloc::bench
