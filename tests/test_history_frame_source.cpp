// An interpreter's frames in the recorded stacks (set_frame_source): a source
// that stands in for Python's hands out tokens; the dump names them, and the
// merged captures put them after the native frames, cut at the interpreter.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "allocator_support.hpp"
#include "cachealloc/cachealloc.h"
#include "cachealloc/errors.hpp"
#include "cachealloc/history.hpp"
#include "cachealloc/snapshot/format.hpp"

using namespace cachealloc;
using snapshot::EventKind;
using test_support::MiB;

namespace {

// The "interpreter" frames of the calling thread, innermost first: the test
// sets them, as a Python function calling deeper would.
thread_local std::vector<std::uint64_t> t_interpreter_frames;

std::uint32_t capture_fake(std::uint64_t* tokens, std::uint32_t max_tokens, void*) {
  std::uint32_t count = 0;
  for (; count < max_tokens && count < t_interpreter_frames.size(); ++count) tokens[count] = t_interpreter_frames[count];
  return count;
}

// Token n is "f<n>" at app.py:<10 n>; `context` prefixes the name, so two
// sources tell apart who described a frame. Tokens over 1000 are unknown.
int describe_fake(std::uint64_t token, cachealloc_interpreter_frame* frame, void* context) {
  if (token > 1000) return 0;
  thread_local std::string name;
  name = static_cast<const char*>(context) + std::to_string(token);
  frame->function = name.c_str();
  frame->file = "app.py";
  frame->line = static_cast<std::uint32_t>(token * 10);
  return 1;
}

char g_first_prefix[] = "f";
char g_second_prefix[] = "g";

cachealloc_frame_source fake_source(const void* interpreter_code = nullptr, char* prefix = g_first_prefix) {
  cachealloc_frame_source source;
  cachealloc_frame_source_init(&source);
  source.capture = capture_fake;
  source.describe = describe_fake;
  source.interpreter_code = interpreter_code;
  source.context = prefix;
  return source;
}

// Removes the source when a case ends, so the other suites see none.
struct InstalledSource {
  explicit InstalledSource(const cachealloc_frame_source& source) { set_frame_source(&source); }
  ~InstalledSource() {
    set_frame_source(nullptr);
    t_interpreter_frames.clear();
  }
};

std::string text(const snapshot::Snapshot& s, snapshot::StringId id) { return s.strings.at(id.value); }

std::string module_of(std::uint64_t ip) {
  Dl_info info{};
  return dladdr(reinterpret_cast<void*>(ip - 1), &info) != 0 && info.dli_fname ? info.dli_fname : "";
}

const snapshot::Stack* alloc_stack(const snapshot::Snapshot& s) {
  for (const snapshot::Event& e : s.events)
    if (e.kind == EventKind::alloc) return e.stack ? &s.stacks.at(e.stack.value) : nullptr;
  return nullptr;
}

// "function file:line" of each interpreter frame of `stack` (ip 0, no module).
std::vector<std::string> interpreter_frames(const snapshot::Snapshot& s, const snapshot::Stack& stack) {
  std::vector<std::string> out;
  for (snapshot::FrameId id : stack.frames) {
    const snapshot::Frame& f = s.frames.at(id.value);
    if (f.ip == 0 && !f.module) out.push_back(text(s, f.function) + " " + text(s, f.file) + ":" + std::to_string(f.line));
  }
  return out;
}

snapshot::Snapshot record_one_alloc(StackCapture capture, std::uint32_t max_frames = 32) {
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.stacks = capture;
  options.max_frames = max_frames;
  HistoryRecorder recorder(allocator, options);
  void* ptr = allocator.allocate(MiB);
  snapshot::Snapshot s = recorder.take_snapshot();
  allocator.deallocate(ptr);
  return s;
}

// Called back by qsort: its caller's frames are libc's, which stands for
// the interpreter in the merged captures below.
CachingAllocator* g_allocator = nullptr;
void* g_allocated = nullptr;
extern "C" __attribute__((noinline)) int compare_and_allocate(const void* a, const void* b) {
  if (g_allocated == nullptr) g_allocated = g_allocator->allocate(MiB);
  return *static_cast<const int*>(a) - *static_cast<const int*>(b);
}

snapshot::Snapshot record_alloc_under_libc(StackCapture capture) {
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.stacks = capture;
  options.max_frames = 64;
  HistoryRecorder recorder(allocator, options);
  g_allocator = &allocator;
  g_allocated = nullptr;
  int values[2] = {2, 1};
  std::qsort(values, 2, sizeof(int), compare_and_allocate);
  snapshot::Snapshot s = recorder.take_snapshot();
  allocator.deallocate(g_allocated);
  return s;
}

}  // namespace

TEST_CASE("stacks=python records the source's frames innermost first, named at the dump without address or module") {
  InstalledSource installed(fake_source());
  t_interpreter_frames = {3, 2, 1};
  const snapshot::Snapshot s = record_one_alloc(StackCapture::python);
  const snapshot::Stack* stack = alloc_stack(s);
  REQUIRE(stack != nullptr);
  CHECK(stack->frames.size() == 3);
  CHECK(interpreter_frames(s, *stack) == std::vector<std::string>{"f3 app.py:30", "f2 app.py:20", "f1 app.py:10"});
  CHECK(s.settings.at("history.stacks") == "python");
}

TEST_CASE("a streamed recording names the source's frames as the dump does") {
  InstalledSource installed(fake_source());
  t_interpreter_frames = {2, 1};
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("frame_source_stream_" + std::to_string(::getpid()) + ".bin");
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.stacks = StackCapture::python;
  options.stream = path;
  HistoryRecorder recorder(allocator, options);
  void* ptr = allocator.allocate(MiB);
  recorder.stop();
  allocator.deallocate(ptr);
  const snapshot::Snapshot s = snapshot::read_snapshot(path);
  std::filesystem::remove(path);
  const snapshot::Stack* stack = alloc_stack(s);
  REQUIRE(stack != nullptr);
  CHECK(interpreter_frames(s, *stack) == std::vector<std::string>{"f2 app.py:20", "f1 app.py:10"});
}

TEST_CASE("stacks=python gives no stack on a thread that runs no interpreter code, or with no source installed") {
  SUBCASE("no interpreter frame on this thread") {
    InstalledSource installed(fake_source());
    CHECK(alloc_stack(record_one_alloc(StackCapture::python)) == nullptr);
  }
  SUBCASE("no source") {
    set_frame_source(nullptr);
    t_interpreter_frames = {1};
    CHECK(alloc_stack(record_one_alloc(StackCapture::python)) == nullptr);
    t_interpreter_frames.clear();
  }
}

TEST_CASE("native+python keeps the native frames down to the first frame inside the interpreter, then its frames") {
  // libc plays the interpreter: qsort calls back into this program.
  InstalledSource installed(fake_source(reinterpret_cast<const void*>(&std::qsort)));
  t_interpreter_frames = {7, 6};
  const snapshot::Snapshot s = record_alloc_under_libc(StackCapture::native_python);
  const snapshot::Stack* stack = alloc_stack(s);
  REQUIRE(stack != nullptr);
  REQUIRE(stack->frames.size() >= 3);
  const std::size_t natives = stack->frames.size() - 2;
  for (std::size_t i = 0; i < natives; ++i) {
    const snapshot::Frame& f = s.frames.at(stack->frames[i].value);
    CHECK(f.ip != 0);
    CHECK(module_of(f.ip).find("libc.so") == std::string::npos);
  }
  // The last native frame is the callback: the return into qsort was cut.
  const snapshot::Frame& last_native = s.frames.at(stack->frames[natives - 1].value);
  const auto callback = reinterpret_cast<std::uintptr_t>(&compare_and_allocate);
  CHECK(last_native.ip > callback);
  CHECK(last_native.ip < callback + 256);
  CHECK(interpreter_frames(s, *stack) == std::vector<std::string>{"f7 app.py:70", "f6 app.py:60"});
}

TEST_CASE("native+python on a thread that runs no interpreter code keeps the native stack whole") {
  InstalledSource installed(fake_source(reinterpret_cast<const void*>(&std::qsort)));
  const snapshot::Snapshot merged = record_alloc_under_libc(StackCapture::native_python);
  const snapshot::Snapshot native = record_alloc_under_libc(StackCapture::native);
  REQUIRE(alloc_stack(merged) != nullptr);
  REQUIRE(alloc_stack(native) != nullptr);
  CHECK(alloc_stack(merged)->frames.size() == alloc_stack(native)->frames.size());
  CHECK(interpreter_frames(merged, *alloc_stack(merged)).empty());
}

TEST_CASE("a C++ thread beside an interpreter thread gets native frames only") {
  InstalledSource installed(fake_source());
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.stacks = StackCapture::native_python;
  HistoryRecorder recorder(allocator, options);
  t_interpreter_frames = {4};
  void* python_side = allocator.allocate(MiB);
  void* cpp_side = nullptr;
  std::thread([&] { cpp_side = allocator.allocate(2 * MiB); }).join();
  const snapshot::Snapshot s = recorder.take_snapshot();
  allocator.deallocate(python_side);
  allocator.deallocate(cpp_side);
  int checked = 0;
  for (const snapshot::Event& e : s.events) {
    if (e.kind != EventKind::alloc) continue;
    REQUIRE(e.stack);
    const auto frames = interpreter_frames(s, s.stacks.at(e.stack.value));
    if (e.size == 2 * MiB) CHECK(frames.empty());
    else CHECK(frames == std::vector<std::string>{"f4 app.py:40"});
    ++checked;
  }
  CHECK(checked == 2);
}

TEST_CASE("the merged stack keeps the innermost max_frames frames") {
  InstalledSource installed(fake_source());
  t_interpreter_frames = {9, 8, 7, 6, 5, 4, 3, 2, 1};
  const snapshot::Snapshot s = record_one_alloc(StackCapture::python, 4);
  REQUIRE(alloc_stack(s) != nullptr);
  CHECK(interpreter_frames(s, *alloc_stack(s)) ==
        std::vector<std::string>{"f9 app.py:90", "f8 app.py:80", "f7 app.py:70", "f6 app.py:60"});
}

TEST_CASE("a token recorded from a replaced source is still described by that source") {
  auto device = test_support::simulated();
  CachingAllocator allocator(device);
  HistoryOptions options;
  options.stacks = StackCapture::python;
  HistoryRecorder recorder(allocator, options);
  const cachealloc_frame_source first = fake_source(nullptr, g_first_prefix);
  const cachealloc_frame_source second = fake_source(nullptr, g_second_prefix);
  set_frame_source(&first);
  t_interpreter_frames = {1};
  void* a = allocator.allocate(MiB);
  set_frame_source(&second);
  void* b = allocator.allocate(2 * MiB);
  const snapshot::Snapshot s = recorder.take_snapshot();
  set_frame_source(nullptr);
  t_interpreter_frames.clear();
  allocator.deallocate(a);
  allocator.deallocate(b);
  std::vector<std::string> names;
  for (const snapshot::Event& e : s.events)
    if (e.kind == EventKind::alloc) names.push_back(interpreter_frames(s, s.stacks.at(e.stack.value)).at(0));
  CHECK(names == std::vector<std::string>{"f1 app.py:10", "g1 app.py:10"});
}

TEST_CASE("a token its source does not know stays an unnamed frame, and recording goes on") {
  InstalledSource installed(fake_source());
  t_interpreter_frames = {5000};
  const snapshot::Snapshot s = record_one_alloc(StackCapture::python);
  REQUIRE(alloc_stack(s) != nullptr);
  const snapshot::Frame& f = s.frames.at(alloc_stack(s)->frames.at(0).value);
  CHECK(!f.function);
  CHECK(f.ip != 0);
}

TEST_CASE("the capture names parse and print, and with_interpreter_frames adds the interpreter's") {
  for (const char* name : {"none", "native", "unwind", "python", "native+python", "unwind+python"})
    CHECK(std::string(to_string(parse_stack_capture(name))) == name);
  CHECK_THROWS_AS(parse_stack_capture("all"), InvalidArgument);
  CHECK(with_interpreter_frames(StackCapture::none) == StackCapture::python);
  CHECK(with_interpreter_frames(StackCapture::native) == StackCapture::native_python);
  CHECK(with_interpreter_frames(StackCapture::unwind) == StackCapture::unwind_python);
  CHECK(with_interpreter_frames(StackCapture::native_python) == StackCapture::native_python);
  CHECK(parse_history_setting("stream:/tmp/x.bin,stacks:native+python").stacks == StackCapture::native_python);
}

TEST_CASE("the C ABI refuses a frame source without capture or describe, and takes the python captures") {
  cachealloc_frame_source source;
  cachealloc_frame_source_init(&source);
  CHECK(cachealloc_set_frame_source(&source) == CACHEALLOC_INVALID_ARGUMENT);
  CHECK(std::string(cachealloc_last_error()).find("capture and describe") != std::string::npos);
  source = fake_source();
  CHECK(cachealloc_set_frame_source(&source) == CACHEALLOC_OK);
  CHECK(cachealloc_set_frame_source(nullptr) == CACHEALLOC_OK);
  cachealloc_history_options options;
  cachealloc_history_options_init(&options);
  options.stacks = 6;
  CHECK(cachealloc_record_history(&options) == CACHEALLOC_INVALID_ARGUMENT);
}
