#include "python_frames.hpp"

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
#define CACHEALLOC_WALKS_PYTHON_FRAMES 1
// The interpreter's frame structs are internal, as in memray and py-spy:
// their layout is fixed within a minor version, which these headers are.
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#else
#define CACHEALLOC_WALKS_PYTHON_FRAMES 0
#endif

// The torch extension that links this may be loaded by a program with no
// interpreter (a LibTorch C++ program): the interpreter's symbols are weak,
// and where Py_Version is absent no frame is walked.
#pragma weak PyEval_EvalCode
#pragma weak PyGILState_GetThisThreadState
#pragma weak PyCode_Addr2Line
#if CACHEALLOC_WALKS_PYTHON_FRAMES
#pragma weak Py_Version
#endif

#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace cachealloc::python {
namespace {

// What a token names: strings kept for the process's life, so describe can
// hand out pointers into them.
struct NamedFrame {
  std::string function;
  std::string file;
  std::uint32_t line = 0;
};

// One (code object, instruction) as first seen, with the code's name and
// file objects: a code object freed and another made at its address has
// other name or file objects, unless it is the same function compiled again
// from the same file (exec of the same source, a module reloaded), whose
// frame it then names. That is the one risk left: the code object cannot be
// kept alive without the GIL, so a line shifted by an edit between two loads
// of one file can be misnamed.
struct FrameKey {
  const void* code = nullptr;
  const void* name = nullptr;
  const void* file = nullptr;
  std::uint32_t instruction = 0;  // code units from the start of the code
  bool operator==(const FrameKey&) const = default;
};

// One multiply: it runs once per frame of every captured stack.
std::uint64_t hash_key(const void* code, std::uint32_t instruction) noexcept {
  return ((reinterpret_cast<std::uintptr_t>(code) >> 4) ^ (std::uint64_t{instruction} << 40)) * 0x9e3779b97f4a7c15ull;
}

struct FrameKeyHash {
  std::size_t operator()(const FrameKey& k) const noexcept { return hash_key(k.code, k.instruction); }
};

// Every frame named so far, deduplicated by text: a token per (function,
// file, line), so the instructions of one line share a token and a stack.
class FrameNames {
 public:
  std::uint32_t token_of(NamedFrame frame) {
    std::string key = frame.function;
    key += '\0';
    key += frame.file;
    key += '\0';
    key += std::to_string(frame.line);
    std::lock_guard lock(mutex_);
    auto [it, inserted] = tokens_.try_emplace(std::move(key), static_cast<std::uint32_t>(frames_.size() + 1));
    if (inserted) frames_.push_back(std::move(frame));
    return it->second;
  }
  bool describe(std::uint64_t token, cachealloc_interpreter_frame& out) {
    std::lock_guard lock(mutex_);
    if (token == 0 || token > frames_.size()) return false;
    const NamedFrame& frame = frames_[token - 1];  // a deque: never moves once added
    out.function = frame.function.c_str();
    out.file = frame.file.c_str();
    out.line = frame.line;
    return true;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::uint32_t> tokens_;
  std::deque<NamedFrame> frames_;
};

// (code, instruction) -> token for every thread, in shards so that threads
// missing their caches at once rarely wait for each other.
class SharedFrameTable {
 public:
  template <class Name>
  std::uint32_t token_of(const FrameKey& key, Name&& name) {
    Shard& shard = shards_[hash_key(key.code, key.instruction) >> 60];  // kShards: the top 4 bits
    std::lock_guard lock(shard.mutex);
    auto it = shard.tokens.find(key);
    if (it != shard.tokens.end()) return it->second;
    const std::uint32_t token = names.token_of(name());
    shard.tokens.emplace(key, token);
    return token;
  }
  FrameNames names;

 private:
  static constexpr std::size_t kShards = 16;
  struct alignas(64) Shard {
    std::mutex mutex;
    std::unordered_map<FrameKey, std::uint32_t, FrameKeyHash> tokens;
  };
  Shard shards_[kShards];
};

// Never destroyed: threads may allocate while the process exits.
SharedFrameTable& shared_table() {
  static auto* table = new SharedFrameTable;
  return *table;
}

// One thread's frames seen before: a hit is a few loads and compares, no
// lock and no line another thread writes. Each level of the last stack
// first (`last`: a loop allocates from the same frames again and again, and
// that needs no hash), then a direct-mapped table by (code, instruction).
struct ThreadCache {
  static constexpr std::size_t kEntries = 1024;
  static constexpr std::size_t kLevels = 128;
  struct Entry {  // 32 bytes, two to a cache line
    const void* code = nullptr;  // nullptr: empty
    const void* name = nullptr;
    const void* file = nullptr;
    std::uint32_t instruction = 0;
    std::uint32_t token = 0;
  };
  Entry entries[kEntries];
  Entry last[kLevels];
};

thread_local ThreadCache* t_cache = nullptr;
struct ThreadCacheOwner {
  std::unique_ptr<ThreadCache> cache;
  ~ThreadCacheOwner() { t_cache = nullptr; }
};
thread_local ThreadCacheOwner t_cache_owner;

ThreadCache* thread_cache() noexcept {
  if (t_cache != nullptr) [[likely]]
    return t_cache;
  try {
    t_cache_owner.cache = std::make_unique<ThreadCache>();
    t_cache = t_cache_owner.cache.get();
  } catch (...) {
  }
  return t_cache;
}

// A str's UTF-8 without the GIL: PyUnicode_AsUTF8 may allocate and cache
// its result inside the object, which needs the GIL; this reads the
// object's characters only.
std::string utf8_of(PyObject* text) {
  std::string out;
  if (text == nullptr || !PyUnicode_Check(text)) return out;
#if PY_VERSION_HEX < 0x030C0000
  if (!PyUnicode_IS_READY(text)) return "?";
#endif
  const Py_ssize_t length = PyUnicode_GET_LENGTH(text);
  if (PyUnicode_IS_ASCII(text)) return std::string(static_cast<const char*>(PyUnicode_DATA(text)), length);
  const int kind = PyUnicode_KIND(text);
  const void* data = PyUnicode_DATA(text);
  for (Py_ssize_t i = 0; i < length; ++i) {
    const Py_UCS4 c = PyUnicode_READ(kind, data, i);
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xc0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else if (c >= 0xd800 && c < 0xe000) {
      out += '?';  // a lone surrogate has no UTF-8
    } else if (c < 0x10000) {
      out += static_cast<char>(0xe0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  return out;
}

#if CACHEALLOC_WALKS_PYTHON_FRAMES

// The version-specific parts of the walk, one accessor each.
_PyInterpreterFrame* innermost_frame(PyThreadState* thread) noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return thread->current_frame;
#else
  return thread->cframe != nullptr ? thread->cframe->current_frame : nullptr;
#endif
}

// The frame's code object; nullptr for a frame that runs none (3.13's
// f_executable may be another object).
PyCodeObject* code_of(_PyInterpreterFrame* frame) noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* executable = frame->f_executable;
  return executable != nullptr && PyCode_Check(executable) ? reinterpret_cast<PyCodeObject*>(executable) : nullptr;
#else
  return frame->f_code;
#endif
}

_Py_CODEUNIT* instruction_of(_PyInterpreterFrame* frame) noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return frame->instr_ptr;
#else
  return frame->prev_instr;
#endif
}

// Frames Python's own tracebacks skip: one owned by the C stack (the shim
// that enters the interpreter from C, 3.12 on), and one not started yet
// (before its first traceable instruction: _PyFrame_IsIncomplete).
bool skipped(_PyInterpreterFrame* frame, PyCodeObject* code, _Py_CODEUNIT* instruction) noexcept {
#if PY_VERSION_HEX >= 0x030C0000
  if (frame->owner == FRAME_OWNED_BY_CSTACK) return true;
#endif
  return frame->owner != FRAME_OWNED_BY_GENERATOR && instruction < _PyCode_CODE(code) + code->_co_firsttraceable;
}

NamedFrame name_frame(PyCodeObject* code, std::uint32_t instruction) {
  NamedFrame frame;
  frame.function = utf8_of(code->co_name);
  frame.file = utf8_of(code->co_filename);
  // PyCode_Addr2Line only reads the code's line table: safe without the GIL.
  const int line = PyCode_Addr2Line(code, static_cast<int>(instruction * sizeof(_Py_CODEUNIT)));
  frame.line = line > 0 ? static_cast<std::uint32_t>(line) : 0;
  return frame;
}

// A frame the thread's cache does not hold: the shared table, which names it
// if no thread has seen it. Out of line, so that the walk keeps its
// registers. Returns 0 when out of memory.
__attribute__((noinline)) std::uint32_t token_on_miss(ThreadCache::Entry& entry, PyCodeObject* code,
                                                      std::uint32_t instruction) noexcept {
  const FrameKey key{code, code->co_name, code->co_filename, instruction};
  try {
    entry.token = shared_table().token_of(key, [&] { return name_frame(code, instruction); });
  } catch (...) {
    return 0;  // the frame is left out, the allocation goes on
  }
  entry.code = key.code;
  entry.name = key.name;
  entry.file = key.file;
  entry.instruction = instruction;
  return entry.token;
}

std::uint32_t capture_python_frames(std::uint64_t* tokens, std::uint32_t max_tokens, void*) {
  // The calling thread's own state, from the thread-specific key: with the
  // GIL released, the "current" thread state is another thread's, or none.
  PyThreadState* thread = PyGILState_GetThisThreadState();
  if (thread == nullptr) return 0;
  ThreadCache* const cache = thread_cache();
  if (cache == nullptr) return 0;
  const auto matches = [](const ThreadCache::Entry& entry, PyCodeObject* code, std::uint32_t offset) {
    return entry.code == code && entry.instruction == offset && entry.name == code->co_name &&
           entry.file == code->co_filename;
  };
  std::uint32_t count = 0;
  for (_PyInterpreterFrame* frame = innermost_frame(thread); frame != nullptr && count < max_tokens;
       frame = frame->previous) {
    PyCodeObject* code = code_of(frame);
    if (code == nullptr) continue;
    _Py_CODEUNIT* instruction = instruction_of(frame);
    if (skipped(frame, code, instruction)) continue;
    const auto offset = static_cast<std::uint32_t>(instruction - _PyCode_CODE(code));
    ThreadCache::Entry* level = count < ThreadCache::kLevels ? &cache->last[count] : nullptr;
    if (level != nullptr && matches(*level, code, offset)) [[likely]] {
      tokens[count++] = level->token;
      continue;
    }
    ThreadCache::Entry& entry = cache->entries[hash_key(code, offset) >> 54];  // 10 bits: kEntries
    std::uint32_t token = entry.token;
    if (!matches(entry, code, offset)) [[unlikely]] {
      token = token_on_miss(entry, code, offset);
      if (token == 0) continue;
    }
    if (level != nullptr) *level = entry;
    tokens[count++] = token;
  }
  return count;
}

#endif

std::uint32_t capture_nothing(std::uint64_t*, std::uint32_t, void*) { return 0; }

// The frame structs are those of the headers' minor version: read by
// another interpreter (a library built for 3.12 loaded into 3.11) they
// would be garbage, so the walk runs only where the versions agree.
bool walks_running_interpreter() noexcept {
#if CACHEALLOC_WALKS_PYTHON_FRAMES
  if (&Py_Version == nullptr) return false;  // no interpreter in this process
  return (Py_Version >> 16) == (static_cast<unsigned long>(PY_VERSION_HEX) >> 16);
#else
  return false;
#endif
}

static_assert(ThreadCache::kEntries == 1024, "capture_python_frames indexes the cache by the hash's top 10 bits");

int describe_python_frame(std::uint64_t token, cachealloc_interpreter_frame* frame, void*) {
  try {
    return shared_table().names.describe(token, *frame) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

}  // namespace

cachealloc_frame_source python_frame_source() noexcept {
  cachealloc_frame_source source{};
  source.size = sizeof(source);
  source.capture = walks_running_interpreter() ? capture_python_frames : capture_nothing;
  source.describe = describe_python_frame;
  // Any function of the interpreter: its module (libpython, or the python
  // executable that links it statically) is where the merged stacks' native
  // frames end.
  source.interpreter_code = reinterpret_cast<const void*>(&PyEval_EvalCode);
  return source;
}

bool python_frames_supported() noexcept { return walks_running_interpreter(); }

}  // namespace cachealloc::python
