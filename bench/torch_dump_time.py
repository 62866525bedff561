"""PyTorch's _dump_snapshot with many distinct stacks, to set beside
bench_dump_time (docs/PERFORMANCE.md).

    python3 bench/torch_dump_time.py [events=1000000] [distinct=10000] [timeout_s=240]

For stacks='python' and stacks='all' in turn, each in a fresh process:
records `events` trace entries of 4 KiB alloc+free pairs (alloc,
free_requested, free_completed: 3 entries per pair), the allocations made
from `distinct` different Python call paths (a 14-level descent through two
call sites per level, picked by the bits of the pair's number, as
bench_dump_time does in C++), then times torch.cuda.memory._dump_snapshot()
twice. A mode that does not finish within timeout_s is reported as such."""
import os, subprocess, sys, tempfile, time

LEVELS = 14


def child(stacks, events, distinct):
    import torch
    torch.empty(1, device='cuda')
    torch.cuda.memory._record_memory_history(enabled='all', stacks=stacks, max_entries=events)

    def leaf():
        t = torch.empty(1024, dtype=torch.float32, device='cuda')
        del t

    def descend(path, level):
        if level == LEVELS:
            leaf()
        elif (path >> level) & 1:
            right(path, level)
        else:
            left(path, level)

    def left(path, level):
        descend(path, level + 1)

    def right(path, level):
        descend(path, level + 1)

    pairs = (events + 2) // 3
    t = time.perf_counter()
    for i in range(pairs):
        descend(i % distinct, 0)
    recording = time.perf_counter() - t
    out = os.path.join(tempfile.mkdtemp(), 'dump.pickle')
    t = time.perf_counter()
    torch.cuda.memory._dump_snapshot(out)
    first = time.perf_counter() - t
    t = time.perf_counter()
    torch.cuda.memory._dump_snapshot(out)
    second = time.perf_counter() - t
    size = os.path.getsize(out)
    entries = sum(len(trace) for trace in torch.cuda.memory._snapshot()['device_traces'])
    print(f"pytorch stacks='{stacks}': {entries} trace entries ({pairs} pairs from {distinct} distinct call paths) "
          f"recorded in {recording:.2f} s; _dump_snapshot: {first:.3f} s the first time, {second:.3f} s the second; "
          f"file {size / 1e6:.1f} MB", flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == '--child':
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    distinct = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 240
    for stacks in ('python', 'all'):
        try:
            subprocess.run([sys.executable, __file__, '--child', stacks, str(events), str(distinct)], check=True,
                           timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"pytorch stacks='{stacks}': did not finish within {timeout:.0f} s (recording plus two dumps)",
                  flush=True)


if __name__ == '__main__':
    main()
