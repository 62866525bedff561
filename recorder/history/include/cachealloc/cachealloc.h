/* The C ABI of cachealloc: a process-wide caching allocator with memory
 * history, for use from other languages (a PyTorch pluggable allocator, ctypes).
 *
 * The allocator is created on first use on the device that CACHEALLOC_DEVICE
 * selects (auto: the GPU when there is one) with the settings of
 * CACHEALLOC_CONF; with CACHEALLOC_HISTORY=stream:/path/run.{pid}.bin it
 * also streams its whole history there until exit (README, "Recording a
 * whole run"). No function throws or aborts; failures are reported by the
 * return value, and cachealloc_last_error() describes the last one on the
 * calling thread.
 *
 * Thread safety: every function may be called from any thread. */
#ifndef CACHEALLOC_CACHEALLOC_H
#define CACHEALLOC_CACHEALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
enum {
  CACHEALLOC_OK = 0,
  CACHEALLOC_INVALID_ARGUMENT = 1, /* a bad option or argument */
  CACHEALLOC_IO_ERROR = 2,         /* the snapshot could not be written; recording is now off */
  CACHEALLOC_DEVICE_ERROR = 3,     /* the allocator could not be created or the device failed */
};

/* The stacks recorded (cachealloc/history.hpp, StackCapture, says more).
 * The PYTHON ones add the frames of the frame source installed with
 * cachealloc_set_frame_source (Python's: libcachealloc_python). */
enum {
  CACHEALLOC_STACKS_NONE = 0,
  CACHEALLOC_STACKS_NATIVE = 1,        /* frame pointers, tens of ns */
  CACHEALLOC_STACKS_UNWIND = 2,        /* the DWARF unwinder, microseconds */
  CACHEALLOC_STACKS_PYTHON = 3,        /* the interpreter's frames only */
  CACHEALLOC_STACKS_NATIVE_PYTHON = 4, /* native frames down to the interpreter, then its frames */
  CACHEALLOC_STACKS_UNWIND_PYTHON = 5, /* the same, unwound */
};

typedef struct cachealloc_history_options {
  int enabled;              /* 0: stop recording */
  uint64_t max_entries;     /* ring capacity in events, >= 1 */
  int stacks;               /* one of CACHEALLOC_STACKS_* */
  uint32_t max_frames;      /* 1..256 */
  int stacks_on_free;       /* also capture stacks for frees */
  const char* dump_on_oom;  /* NULL or "": no dump on OOM; else the snapshot path */
} cachealloc_history_options;

/* Fills `options` with the defaults: enabled, 1,000,000 entries, native
 * stacks, 32 frames, no stacks on free, no dump on OOM. */
void cachealloc_history_options_init(cachealloc_history_options* options);

/* Starts (or, with enabled == 0, stops) recording. Restarting clears the
 * recorded events. Returns a status code. */
int cachealloc_record_history(const cachealloc_history_options* options);

/* A streamed recording (format version 7): every event is written to `path`
 * while the program runs, from a background thread, in buffers of at most
 * buffer_bytes. cachealloc_stop_history() (or the next start) writes its
 * trailer; after a crash the file reads up to its last complete chunk.
 * New fields are only ever appended: `size` tells the library how many of
 * them the caller's header knew. */
enum {
  CACHEALLOC_STREAM_WAIT = 0, /* when the disk cannot keep up, the program waits */
  CACHEALLOC_STREAM_DROP = 1, /* ... or events are dropped and counted */
};

typedef struct cachealloc_stream_options {
  size_t size;           /* sizeof(cachealloc_stream_options), set by _init */
  const char* path;      /* the file; "{pid}" and "{device}" in it become the
                            process id and the device index */
  uint64_t buffer_bytes; /* the stream's buffers, all told: >= 16 MiB */
  int when_full;         /* CACHEALLOC_STREAM_WAIT or CACHEALLOC_STREAM_DROP */
} cachealloc_stream_options;

/* Fills `stream` with the defaults: no path, 64 MiB, wait. */
void cachealloc_stream_options_init(cachealloc_stream_options* stream);

/* cachealloc_record_history with the events also streamed to stream->path.
 * A NULL `stream` or an empty path is cachealloc_record_history. Returns
 * CACHEALLOC_IO_ERROR when the file cannot be created (nothing changes). */
int cachealloc_record_history_stream(const cachealloc_history_options* options,
                                     const cachealloc_stream_options* stream);

/* The streamed recording's events written and dropped so far (the last
 * stream's, once stopped). Either pointer may be NULL. */
void cachealloc_stream_progress(uint64_t* events_written, uint64_t* dropped_events);
void cachealloc_stop_history(void);

/* Phases such as "step 3" or "forward". An end closes the calling thread's
 * innermost open begin. NULL names are ignored. */
void cachealloc_annotate_begin(const char* name);
void cachealloc_annotate_end(void);

/* Records what the allocation starting at `ptr` (as cachealloc_malloc or
 * cachealloc_torch_malloc returned it, still live) holds, for a program that
 * learns it after the allocation was made. `category` is one of "parameter",
 * "gradient", "optimizer_state", "activation", "temporary", "workspace",
 * "cuda_graph_pool", "other"; the last tag before the free wins. Ignored
 * while not recording. Returns CACHEALLOC_INVALID_ARGUMENT for a NULL or
 * unknown name (cachealloc_last_error names it), else CACHEALLOC_OK. */
int cachealloc_tag_category(const void* ptr, const char* category);

/* Writes a snapshot atomically to `path`. Returns a status code; on
 * CACHEALLOC_IO_ERROR recording has been switched off. */
int cachealloc_dump_snapshot(const char* path);

/* Device memory of at least `size` bytes for use on `stream` (0 = the
 * default stream; for cuda, a cudaStream_t). NULL when out of memory or on
 * error (see cachealloc_last_error). */
void* cachealloc_malloc(size_t size, uintptr_t stream);
/* Returns memory from cachealloc_malloc. `size` and `stream` are accepted
 * for PyTorch's signature and not needed: the allocator knows both. */
void cachealloc_free(void* ptr, size_t size, uintptr_t stream);

/* PyTorch's pluggable-allocator signatures:
 *   torch.cuda.memory.CUDAPluggableAllocator(path_to_libcachealloc_so,
 *       'cachealloc_torch_malloc', 'cachealloc_torch_free')
 * `device` must be the device the process-wide allocator serves: the current
 * CUDA device when it was created (call torch.cuda.set_device(rank) first,
 * as one process per GPU does); `stream` is a cudaStream_t.
 * A request of 0 bytes returns NULL, as PyTorch expects for empty tensors. */
void* cachealloc_torch_malloc(ptrdiff_t size, int device, void* stream);
void cachealloc_torch_free(void* ptr, ptrdiff_t size, int device, void* stream);

/* torch.cuda.memory_allocated() and friends for the process-wide allocator
 * (PyTorch's own functions do not see a pluggable allocator). */
uint64_t cachealloc_memory_allocated(void);
uint64_t cachealloc_memory_reserved(void);
uint64_t cachealloc_max_memory_allocated(void);
uint64_t cachealloc_max_memory_reserved(void);
void cachealloc_reset_peak_stats(void);
/* Returns every fully free segment to the device. Returns a status code. */
int cachealloc_empty_cache(void);

/* An interpreter's frames (Python's) in the recorded stacks.
 *
 * The recorder knows no interpreter. A frame source, which the embedding
 * program installs, hands it opaque tokens for the interpreter frames of the
 * calling thread at each captured stack, and names each token at dump time.
 * Tokens are interned with native return addresses in one stack table;
 * the recorder tags them (bit 63, never a user-space address) so the two
 * never collide, and writes them to snapshots as frames with a function, a
 * file and a line and no address or module, as PyTorch's Python frames are. */
typedef struct cachealloc_interpreter_frame {
  const char* function; /* NUL-terminated UTF-8; NULL or "" when unknown */
  const char* file;
  uint32_t line;        /* 0 when unknown */
} cachealloc_interpreter_frame;

typedef struct cachealloc_frame_source {
  size_t size; /* sizeof(cachealloc_frame_source), set by _init */
  /* Writes at most max_tokens tokens for the frames the interpreter is
   * running on the calling thread, innermost first, and returns how many;
   * 0 when the thread runs none. A token is any value below 2^56 that the
   * source can describe later. Called on the allocator's hot path, inside
   * the allocator's lock, whatever the interpreter's own locks (the GIL) are
   * doing: it must not block, call back into cachealloc, or throw, and it
   * should cost a few ns a frame. */
  uint32_t (*capture)(uint64_t* tokens, uint32_t max_tokens, void* context);
  /* Names a token this source returned, at dump time (any thread). The
   * strings must stay valid until the next describe call on this source.
   * Returns nonzero when it knows the token. */
  int (*describe)(uint64_t token, cachealloc_interpreter_frame* frame, void* context);
  /* Any code address inside the interpreter (a function of libpython, or
   * of the python executable that links it statically), or NULL. With the
   * NATIVE_PYTHON and UNWIND_PYTHON stacks, the native frames end at the
   * first frame inside that module, and the interpreter's frames follow. */
  const void* interpreter_code;
  void* context; /* passed to capture and describe */
} cachealloc_frame_source;

/* Fills `source` with its size and nothing else. */
void cachealloc_frame_source_init(cachealloc_frame_source* source);

/* Installs `source` (copied) for every recording of this process; NULL
 * removes it. Returns CACHEALLOC_INVALID_ARGUMENT when capture or describe
 * is NULL, or after 64 different sources in one process. */
int cachealloc_set_frame_source(const cachealloc_frame_source* source);

/* The last error on this thread, "" if none. Valid until the next call on
 * this thread. */
const char* cachealloc_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* CACHEALLOC_CACHEALLOC_H */
