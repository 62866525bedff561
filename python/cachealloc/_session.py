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


def record(max_entries=1_000_000, stacks="native"):
    """Starts recording every allocator event (torch.cuda.memory._record_memory_history).

    stacks: "native" (C++ frames, captured by a frame-pointer walk) or "none".
    """
    import torch
    if stacks not in ("native", "none"):
        raise ValueError("stacks must be 'native' or 'none', not %r" % (stacks,))
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all" if stacks == "native" else None, stacks="all", max_entries=max_entries)


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
