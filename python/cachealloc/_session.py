"""record(), annotate(), dump(): memory history on the installed allocator."""
import contextlib
import os

from . import _native


def _device_index(device):
    import torch
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    return torch.device(device).index or 0


def record(max_entries=1_000_000, stacks="unwind", python=True, stream=None, torch_frames=True):
    """Starts recording every allocator event (torch.cuda.memory._record_memory_history).

    stream: a path (str or os.PathLike) to which every event of the run is
    written while it goes on (a streamed recording, read by cachealloc-analyze
    like any snapshot). stop()
    writes its end; after a crash the file reads up to its last complete
    chunk. "{device}" and "{pid}" in the path become the device index and the
    process id: with several devices in one process, put {device} in it.
    None: the ring of max_entries only, for dump().

    stacks: the C++ frames our recorder keeps for cachealloc.dump():
    "unwind" (DWARF unwinding through PyTorch's libraries to its ATen ops;
    the costliest), "native" (frame pointers only, tens of nanoseconds, which
    stop at PyTorch's first frame: cachealloc-analyze then names such sites
    "inside libtorch") or "none".
    python: Python frames, for both dumps. PyTorch's own hook gathers them
    for _snapshot() and dump("run.pickle") (what _memory_viz shows); our
    recorder walks the interpreter's frames itself for dump("run.bin"),
    after the C++ frames of `stacks` (with "none", Python frames alone).
    PyTorch's hook and our stacks are switched on together, so with stacks
    other than "none" the Python frames are gathered whatever python says.
    torch_frames: False keeps PyTorch's hook off: our recorder still walks
    the Python frames for dump("run.bin"), _snapshot() and dump("run.pickle")
    then carry none, and each allocation costs far less (docs/PERFORMANCE.md).
    """
    import torch
    if stacks not in ("unwind", "native", "none"):
        raise ValueError("stacks must be 'unwind', 'native' or 'none', not %r" % (stacks,))
    stream_path = None if stream is None else os.fsencode(stream)
    if stream_path is not None and not stream_path:
        raise ValueError("stream must be a path or None, not an empty string")
    lib = _native.load()
    _native.check(lib.cachealloc_torch_set_stacks(stacks.encode()))
    _native.check(lib.cachealloc_torch_set_stream(stream_path))
    lib.cachealloc_torch_set_torch_frames(1 if torch_frames else 0)
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all" if (python or stacks != "none") else None,
        stacks="python", max_entries=max_entries)


def stop():
    """Stops recording (torch.cuda.memory._record_memory_history(enabled=None));
    what was recorded stays for dump(), and a stream gets its end."""
    import torch
    torch.cuda.memory._record_memory_history(enabled=None)


@contextlib.contextmanager
def annotate(name):
    """Marks a phase ("step 3", "forward") in the current device's recording
    for the block's duration; nothing while that device records nothing."""
    lib = _native.load()
    lib.cachealloc_torch_annotate(1, str(name).encode())
    try:
        yield
    finally:
        lib.cachealloc_torch_annotate(0, None)


def dump(path, device=None):
    """Writes the recording: PyTorch's pickle when path ends in .pickle (what
    _memory_viz and MemoryViz open, with PyTorch's Python frames), else our
    format with our recorder's stacks: C++ frames symbolized, then the
    Python frames it captured (what cachealloc-analyze opens fastest). device: an index, a torch.device or
    "cuda:N"; the current device when None. RuntimeError when nothing was
    recorded on that device or the file cannot be written."""
    path = os.fspath(path)
    if path.endswith(".pickle"):
        import torch
        torch.cuda.memory._dump_snapshot(path)
        return
    lib = _native.load()
    _native.check(lib.cachealloc_torch_dump(_device_index(device), path.encode()))
