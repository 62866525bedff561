"""cachealloc.torch.install(): our allocator becomes PyTorch's CUDA allocator."""
from . import _native

_installed = False


def install():
    """Makes cachealloc PyTorch's CUDA caching allocator for this process.

    Call it before the first CUDA tensor. Afterwards torch.cuda.memory_stats(),
    memory_allocated(), memory_reserved(), memory_summary(), the peak resets,
    empty_cache(), set_per_process_memory_fraction(), record_stream,
    caching_allocator_alloc/_delete, _record_memory_history(), _snapshot() and
    _dump_snapshot() all report and drive our allocator. Settings come from
    PYTORCH_CUDA_ALLOC_CONF (or CACHEALLOC_CONF), with PyTorch's syntax.
    Not supported yet: CUDA graph capture and torch.cuda.MemPool (private
    pools), CUDA IPC, Python frames in the history (ours are native frames).
    """
    global _installed
    if _installed:
        return
    import torch
    if torch.cuda.is_initialized():
        raise RuntimeError("cachealloc.torch.install() must run before the first CUDA tensor "
                           "(CUDA is already initialized in this process)")
    _native.check(_native.load().cachealloc_torch_install())
    _installed = True


def installed():
    """True once install() has made cachealloc the current allocator."""
    return _installed
