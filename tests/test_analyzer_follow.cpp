// --follow (analyzer/follow.hpp): summary, timeline and check on a streamed
// recording while it is written. The stream is written in steps by a thread
// of this test; cachealloc-analyze runs as a child. Skipped when the
// analyzer is not built.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../analyzer/testing/trace_builder.hpp"
#include "cachealloc/analyzer/follow.hpp"
#include "cachealloc/snapshot/format.hpp"
#include "cachealloc/snapshot/stream.hpp"

namespace fs = std::filesystem;
namespace snapshot = cachealloc::snapshot;
namespace analyzer = cachealloc::analyzer;

namespace {

const fs::path kTool = fs::path(CACHEALLOC_BINARY_DIR) / "bin" / "cachealloc-analyze";

fs::path scratch(const std::string& name) {
  return fs::temp_directory_path() / ("cachealloc-follow-" + std::to_string(::getpid()) + "-" + name);
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Child {
  pid_t pid = -1;
  fs::path out, err;
  // Waits; the exit status, or 128 + the signal.
  int wait() const {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

Child start_analyzer(const std::vector<std::string>& args, const std::string& name) {
  Child child{-1, scratch(name + ".out"), scratch(name + ".err")};
  child.pid = ::fork();
  if (child.pid == 0) {
    const int o = ::open(child.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(child.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1), ::dup2(e, 2);
    std::vector<char*> argv{const_cast<char*>(kTool.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(kTool.c_str(), argv.data());
    ::_exit(127);
  }
  return child;
}

// The tables of `s`, as one append.
snapshot::TableAppend all_tables(const snapshot::Snapshot& s) {
  snapshot::TableAppend t;
  t.first_string = 1;
  t.strings.assign(s.strings.begin() + 1, s.strings.end());
  t.first_frame = 1;
  t.frames.assign(s.frames.begin() + 1, s.frames.end());
  t.first_stack = 1;
  t.stacks.assign(s.stacks.begin() + 1, s.stacks.end());
  t.threads = s.threads;
  return t;
}

// Streams `s` to `path` in `steps` pieces, `pause` apart; the trailer last
// unless `finish` is false.
void write_in_steps(const fs::path& path, const snapshot::Snapshot& s, int steps, std::chrono::milliseconds pause,
                    bool finish = true) {
  snapshot::StreamFileWriter writer(path, s);
  writer.append_tables(all_tables(s));
  const std::span<const snapshot::Event> events(s.events);
  const std::size_t step = (events.size() + steps - 1) / steps;
  for (std::size_t at = 0; at < events.size(); at += step) {
    std::this_thread::sleep_for(pause);
    writer.append_events(events.subspan(at, std::min(step, events.size() - at)));
  }
  std::this_thread::sleep_for(pause);
  if (finish) writer.finish(s);
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = 0; (at = text.find(what, at)) != std::string::npos; at += what.size()) ++n;
  return n;
}

}  // namespace

TEST_CASE("summary --follow prints a result as each piece of a stream arrives, and at the trailer the plain summary") {
  if (!fs::exists(kTool)) {
    MESSAGE("cachealloc-analyze is not built; skipping");
    return;
  }
  // Given a recording of 200k events, streamed in 4 steps 400 ms apart
  const snapshot::Snapshot trace = analyzer::testing::random_trace(5, 200'000, 8);
  const fs::path path = scratch("run.bin");
  fs::remove(path);
  std::thread writer([&] { write_in_steps(path, trace, 4, std::chrono::milliseconds(400)); });
  // When summary --follow reads it meanwhile
  const Child follow = start_analyzer({"summary", "--follow", "--follow-interval", "0.05", "--format", "json",
                                       path.string()}, "summary");
  const int code = follow.wait();
  writer.join();
  // Then it ends by itself at the trailer, having printed updates on the way
  CHECK(code == 0);
  const std::string out = slurp(follow.out), err = slurp(follow.err);
  CAPTURE(err);
  CHECK(count(err, "still being written") >= 2);
  CHECK(count(err, "the recording has ended") == 1);
  CHECK(err.ends_with("the recording has ended\n"));
  // and its last result is the plain summary of the finished file
  const Child plain = start_analyzer({"summary", "--format", "json", path.string()}, "plain");
  REQUIRE(plain.wait() == 0);
  const std::string expected = slurp(plain.out);
  REQUIRE(!expected.empty());
  CHECK(out.size() > expected.size());
  CHECK(out.ends_with(expected));
  fs::remove(path);
}

TEST_CASE("timeline and check --follow end at the trailer with the plain result; Ctrl-C ends a follow that has none") {
  if (!fs::exists(kTool)) return;
  const snapshot::Snapshot trace = analyzer::testing::random_trace(6, 100'000, 8);
  const fs::path path = scratch("run2.bin");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"timeline", "--buckets", "10"}, std::vector<std::string>{"check", "--max-peak-reserved", "1T"}}) {
    CAPTURE(args[0]);
    fs::remove(path);
    std::thread writer([&] { write_in_steps(path, trace, 2, std::chrono::milliseconds(300)); });
    std::vector<std::string> with = args;
    with.insert(with.end(), {"--follow", "--follow-interval", "0.05", path.string()});
    const Child follow = start_analyzer(with, "other");
    const int code = follow.wait();
    writer.join();
    CHECK(code == 0);
    std::vector<std::string> plain_args = args;
    plain_args.push_back(path.string());
    const Child plain = start_analyzer(plain_args, "other_plain");
    CHECK(plain.wait() == 0);
    CHECK(slurp(follow.out).ends_with(slurp(plain.out)));
  }
  // Given a stream whose writer never writes its trailer
  fs::remove(path);
  write_in_steps(path, trace, 1, std::chrono::milliseconds(0), false);
  const Child follow = start_analyzer({"summary", "--follow", "--follow-interval", "0.05", path.string()}, "sigint");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  // When it is interrupted, then it ends with the result it printed
  ::kill(follow.pid, SIGINT);
  CHECK(follow.wait() == 0);
  CHECK(count(slurp(follow.err), "still being written") == 1);
  CHECK(!slurp(follow.out).empty());
  fs::remove(path);
}

TEST_CASE("follow_file waits for a file that is not there yet, and stops when asked") {
  // Given no file, and a stop flag set after 200 ms
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stop = true;
  });
  analyzer::FollowOptions options;
  options.interval = std::chrono::milliseconds(10);
  options.stop = &stop;
  int updates = 0;
  // When followed, then nothing is read and the follow ends stopped
  const analyzer::FollowEnd end =
      analyzer::follow_file(scratch("absent.bin"), options, [&](analyzer::FileEvents&, bool) { ++updates; });
  stopper.join();
  CHECK(end == analyzer::FollowEnd::stopped);
  CHECK(updates == 0);
  // And a whole (not streamed) snapshot is read once, finished
  const fs::path whole = fs::path(CACHEALLOC_SOURCE_DIR) / "testdata" / "format_versions" / "v6.bin";
  stop = false;
  CHECK(analyzer::follow_file(whole, options, [&](analyzer::FileEvents&, bool finished) {
          ++updates;
          CHECK(finished);
        }) == analyzer::FollowEnd::finished);
  CHECK(updates == 1);
}

TEST_CASE("follow_file refuses at once a path that exists but can never grow by chunks") {
  // Given paths that exist and are no regular file, and a stop flag set after 1 s
  // (so that a follow that waits on them ends instead of hanging the test)
  const fs::path folder = scratch("folder");
  fs::create_directories(folder);
  for (const fs::path& path : {folder, fs::path("/dev/zero"), fs::path("/dev/null")}) {
    CAPTURE(path);
    std::atomic<bool> stop{false};
    std::thread stopper([&] {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      stop = true;
    });
    analyzer::FollowOptions options;
    options.interval = std::chrono::milliseconds(10);
    options.stop = &stop;
    int updates = 0;
    // When followed, then it is refused with an error naming it, not waited on
    const auto started = std::chrono::steady_clock::now();
    std::string error;
    try {
      analyzer::follow_file(path, options, [&](analyzer::FileEvents&, bool) { ++updates; });
    } catch (const snapshot::SnapshotError& e) {
      error = e.what();
    }
    CHECK(!stop.load());
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::milliseconds(500));
    CHECK(error.find(path.string()) != std::string::npos);
    CHECK(updates == 0);
    stopper.join();
  }
  fs::remove_all(folder);
  // And a file that is there but no snapshot is refused at its first read
  const fs::path junk = scratch("junk.bin");
  std::ofstream(junk, std::ios::binary) << std::string(64, 'X');
  analyzer::FollowOptions options;
  options.interval = std::chrono::milliseconds(10);
  CHECK_THROWS_AS(analyzer::follow_file(junk, options, [](analyzer::FileEvents&, bool) {}), snapshot::SnapshotError);
  fs::remove(junk);
}

TEST_CASE("check --follow interrupted before the trailer cannot conclude (exit 3), and a follow that read nothing fails") {
  if (!fs::exists(kTool)) return;
  const fs::path absent = scratch("never.bin");
  fs::remove(absent);
  const fs::path cut = scratch("cut.bin");
  write_in_steps(cut, analyzer::testing::random_trace(7, 20'000, 4), 1, std::chrono::milliseconds(0), false);
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           // Given a check on a file that never comes: a CI gate must not pass having read nothing
           {{"check", "--follow", "--max-peak-reserved", "1T", absent.string()}, 3, "nothing was read"},
           // or on a stream whose trailer never comes: met so far is not met
           {{"check", "--follow", "--max-peak-reserved", "1T", cut.string()}, 3, "the budgets are not confirmed"},
           // and a summary that had nothing to show
           {{"summary", "--follow", absent.string()}, 2, "nothing was read"},
       }) {
    std::vector<std::string> args = c.args;
    args.insert(args.begin() + 1, {"--follow-interval", "0.05"});
    const Child follow = start_analyzer(args, "interrupted");
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    // When it is interrupted (Ctrl-C)
    ::kill(follow.pid, SIGINT);
    // Then the exit status says it did not conclude, with one line saying why
    CAPTURE(args[0]);
    CAPTURE(args.back());
    CHECK(follow.wait() == c.code);
    const std::string after = slurp(follow.err);
    CAPTURE(after);
    CHECK(after.find(c.says) != std::string::npos);
    CHECK(count(after, "interrupted") == 1);
  }
  fs::remove(cut);
}
