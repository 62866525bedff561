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

enum {
  CACHEALLOC_STACKS_NONE = 0,
  CACHEALLOC_STACKS_NATIVE = 1,
};

typedef struct cachealloc_history_options {
  int enabled;              /* 0: stop recording */
  uint64_t max_entries;     /* ring capacity in events, >= 1 */
  int stacks;               /* CACHEALLOC_STACKS_NONE or CACHEALLOC_STACKS_NATIVE */
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

/* The last error on this thread, "" if none. Valid until the next call on
 * this thread. */
const char* cachealloc_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* CACHEALLOC_CACHEALLOC_H */
