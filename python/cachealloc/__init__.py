"""cachealloc for PyTorch: our caching allocator and memory recorder in place
of PyTorch's, with every torch.cuda memory call still working.

    import cachealloc.torch
    cachealloc.torch.install()          # before the first CUDA tensor
    import cachealloc
    cachealloc.record()                 # torch.cuda.memory._record_memory_history(), our stacks unwound
    with cachealloc.annotate("step 3"):
        ...
    cachealloc.dump("run.bin")          # our format, native stacks; "run.pickle": PyTorch's, Python frames
    cachealloc.track_categories(model, optimizer)   # exact categories, after record()

Then: cachealloc-analyze run.bin (pip install ./python puts it on PATH).
record, annotate and dump need the torch extension (cachealloc.torch);
python -m cachealloc says whether pip install built it.
"""
from ._session import annotate, dump, record, stop


def track_categories(modules=(), optimizers=()):
    """Exact categories (parameter, gradient, optimizer_state, activation) from
    torch's hooks, recorded beside the allocations: see _categories.py."""
    from ._categories import track_categories as track
    return track(modules, optimizers)


__all__ = ["annotate", "dump", "record", "stop", "track_categories"]
__version__ = "0.1.0"
