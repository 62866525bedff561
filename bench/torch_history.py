"""A 4 KiB alloc+free pair from Python through torch's allocator API, with
memory history off and on: PyTorch's own allocator, or ours after
cachealloc.torch.install(). Run both in one session to set them side by side
(docs/PERFORMANCE.md); the figures include the Python call overhead, which
the 'off' row shows.

    python3 bench/torch_history.py [DEPTH] [--allocator pytorch|cachealloc]

DEPTH (default 1): the pairs are made DEPTH Python frames deep, so a row
with Python frames minus the 'off' row is the cost of walking DEPTH frames.
PyTorch: history off, stacks='python' and stacks='all'. Ours: history off,
on without frames, our recorder's Python frames alone
(record(stacks='none', torch_frames=False)), native + Python frames, and
with PyTorch's hook gathering its frames too (what _snapshot() needs).
"""
import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("depth", nargs="?", type=int, default=1)
parser.add_argument("--allocator", choices=["pytorch", "cachealloc"], default="pytorch")
args = parser.parse_args()
if args.allocator == "cachealloc":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import cachealloc
    import cachealloc.torch
    cachealloc.torch.install()
import torch  # noqa: E402

N = 200_000
DEPTH = args.depth


def at_depth(depth, body):
    return body() if depth <= 1 else at_depth(depth - 1, body)


def pairs():
    return at_depth(DEPTH, deep_pairs)


def deep_pairs():
    alloc, free = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
    free(alloc(4096))
    best = float('inf')
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(N):
            free(alloc(4096))
        best = min(best, (time.perf_counter_ns() - t) / N)
    return best


torch.empty(1, device='cuda')
empty_loop = min((lambda t: (sum(1 for _ in range(N)), time.perf_counter_ns() - t)[1])(time.perf_counter_ns())
                 for _ in range(3)) / N
print(f'python loop overhead: {empty_loop:.0f} ns per iteration')
name = args.allocator
print(f'depth {DEPTH}: {name} history off: {pairs():.0f} ns per pair')
if name == "pytorch":
    for stacks in ('python', 'all'):
        torch.cuda.memory._record_memory_history(enabled='all', stacks=stacks, max_entries=1_000_000)
        print(f"depth {DEPTH}: pytorch history on, stacks='{stacks}': {pairs():.0f} ns per pair")
        torch.cuda.memory._record_memory_history(enabled=None)
else:
    modes = (("no frames", dict(stacks="none", python=False)),
             ("our Python frames", dict(stacks="none", python=True, torch_frames=False)),
             ("native + our Python frames", dict(stacks="native", python=True, torch_frames=False)),
             ("our Python frames + PyTorch's hook", dict(stacks="none", python=True, torch_frames=True)))
    for label, options in modes:
        cachealloc.record(max_entries=1_000_000, **options)
        print(f"depth {DEPTH}: cachealloc history on, {label}: {pairs():.0f} ns per pair")
        cachealloc.stop()
