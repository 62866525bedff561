"""cachealloc.torch.install(): our allocator becomes PyTorch's CUDA allocator."""
from . import _native

_installed = False


def install():
    """Makes cachealloc PyTorch's CUDA caching allocator for this process.

    Call it before the first CUDA tensor. Afterwards torch.cuda.memory_stats(),
    memory_allocated(), memory_reserved(), memory_summary(), the peak resets,
    empty_cache(), set_per_process_memory_fraction(), record_stream,
    caching_allocator_alloc/_delete, _record_memory_history(), _snapshot() and
    _dump_snapshot() all report and drive our allocator, and so do CUDA graph
    capture, torch.cuda.MemPool and use_mem_pool (private pools) and the pool
    checkpoints of torch.compile(mode="reduce-overhead"). _snapshot() and
    _dump_snapshot() carry PyTorch's Python frames (its own hook);
    cachealloc.dump("run.bin") carries our recorder's native frames.
    Settings come from PYTORCH_CUDA_ALLOC_CONF (or CACHEALLOC_CONF), with
    PyTorch's syntax.

    Refused with a RuntimeError that says so: a MemPool with an allocator of
    its own, use_on_oom or no_split, and CUDA IPC (sharing CUDA tensors
    between processes).

    Raises cachealloc._native.NotAvailable (a RuntimeError of one line) where
    torch is not importable or the extension was not built; RuntimeError
    once CUDA is already initialized in this process.
    """
    global _installed
    if _installed:
        return
    lib = _native.load()
    import torch
    if torch.cuda.is_initialized():
        raise RuntimeError("cachealloc.torch.install() must run before the first CUDA tensor "
                           "(CUDA is already initialized in this process)")
    _native.check(lib.cachealloc_torch_install())
    _installed = True


def installed():
    """True once install() has made cachealloc the current allocator."""
    return _installed
