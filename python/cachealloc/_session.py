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


def record(max_entries=1_000_000, stacks="unwind", python=True):
    """Starts recording every allocator event (torch.cuda.memory._record_memory_history).

    stacks: the C++ frames our recorder keeps for cachealloc.dump():
    "unwind" (DWARF unwinding, through PyTorch's libraries, ~3-5 us an
    allocation), "native" (frame pointers only, ~20 ns, which stop at the
    first frame of a library built without them) or "none".
    python: also gather Python frames through PyTorch's own hook, for
    _snapshot() and _dump_snapshot() (what _memory_viz shows).
    """
    import torch
    if stacks not in ("unwind", "native", "none"):
        raise ValueError("stacks must be 'unwind', 'native' or 'none', not %r" % (stacks,))
    _native.check(_native.load().cachealloc_torch_set_stacks(stacks.encode()))
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all" if (python or stacks != "none") else None,
        stacks="python", max_entries=max_entries)


def stop():
    """Stops recording; what was recorded stays for dump()."""
    import torch
    torch.cuda.memory._record_memory_history(enabled=None)


@contextlib.contextmanager
def annotate(name):
    """Marks a phase ("step 3", "forward") in the recording for the block's duration."""
    lib = _native.load()
    lib.cachealloc_torch_annotate(1, str(name).encode())
    try:
        yield
    finally:
        lib.cachealloc_torch_annotate(0, None)


def dump(path, device=None):
    """Writes the recording: PyTorch's pickle when path ends in .pickle (what
    _memory_viz and MemoryViz open), else our format with native stacks
    symbolized (what cachealloc-analyze opens fastest)."""
    path = os.fspath(path)
    if path.endswith(".pickle"):
        import torch
        torch.cuda.memory._dump_snapshot(path)
        return
    lib = _native.load()
    _native.check(lib.cachealloc_torch_dump(_device_index(device), path.encode()))
