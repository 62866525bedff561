"""PyTorch's 4 KiB alloc+free pair from Python, with memory history off and on,
to set beside bench_history_overhead (see docs/PERFORMANCE.md). The figures
include the Python call overhead, which the 'off' row shows.

    python3 bench/torch_history.py [DEPTH]

DEPTH (default 1): the pairs are made DEPTH Python frames deep, as
bench/python_frames.py makes ours (10 and 30 there): stacks='python' against
off is then PyTorch's cost of Python frames at that depth."""
import sys, time, torch
N = 200_000
DEPTH = int(sys.argv[1]) if len(sys.argv) > 1 else 1
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
empty_loop = min((lambda t: (sum(1 for _ in range(N)), time.perf_counter_ns() - t)[1])(time.perf_counter_ns()) for _ in range(3)) / N
print(f'python loop overhead: {empty_loop:.0f} ns per iteration')
print(f'depth {DEPTH}: pytorch history off: {pairs():.0f} ns per pair')
for stacks in ('python', 'all'):
    torch.cuda.memory._record_memory_history(enabled='all', stacks=stacks, max_entries=1_000_000)
    print(f"pytorch history on, stacks='{stacks}': {pairs():.0f} ns per pair")
    torch.cuda.memory._record_memory_history(enabled=None)
