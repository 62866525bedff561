#!/usr/bin/env python3
"""Times Python's pickle.load against `cachealloc-analyze summary` on the same
PyTorch memory-snapshot pickle, best of N each, and prints the ratio and the
analyzer's peak RSS. No torch needed.

  python3 bench/pickle_vs_python.py BIG.pickle build/bin/cachealloc-analyze [--runs 3]

--make N writes a PyTorch-shaped pickle with N allocations (3 trace entries
each: alloc, free_requested, free_completed) to the pickle path first. It has
what `_dump_snapshot` writes and our own writer does not: protocol 4 with FRAME
opcodes, every dict and list memoized, frame dicts {filename, line, name}
shared through BINGET, a fresh frames list and a fresh 'compile_context'
string per entry. --frames MIN MAX sets the stack depth (default 2 to 6, which
gives about the 62 bytes per trace entry of make_snapshots.py big).

--convert N [N ...] times pickles our own writer makes, one row per size:
for each N, `cachealloc-synthetic --events N --seed 1 --stacks native` (found
beside the analyzer) then `cachealloc-analyze convert` write PICKLE.N.bin and
PICKLE.N.pickle (kept and reused when present; --fresh makes them again), and
each is timed as above. --timeout S gives up on a summary run after S seconds
and says so (a row of '>S').

  python3 bench/pickle_vs_python.py /tmp/ours build/bin/cachealloc-analyze --convert 1000000 3000000 5000000 10000000
"""
import argparse
import os
import pickle
import random
import resource
import subprocess
import sys
import time


def make_pytorch_like(path, allocations, min_frames=2, max_frames=6, seed=3):
    rng = random.Random(seed)
    files = ['/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/modules/%s.py' % m
             for m in ('module', 'rnn', 'linear', 'conv', 'activation', 'container')] + ['/work/train.py']
    frames = [{'filename': rng.choice(files), 'line': rng.randrange(1, 3000), 'name': 'fn_%d' % i}
              for i in range(400)]
    stacks = []
    for _ in range(2000):
        depth = rng.randrange(min_frames, max_frames + 1)
        stacks.append([rng.choice(frames) for _ in range(depth)])
    trace, live, segments = [], [], []
    time_us = 1796052584138525
    base = 140091842363392
    stream = 0
    next_address = base
    for i in range(allocations):
        size = rng.randrange(1, 1 << 22)
        block = (size + 511) // 512 * 512
        address = next_address
        next_address += block
        time_us += rng.randrange(1, 50)
        stack = stacks[rng.randrange(len(stacks))]
        trace.append({'action': 'alloc', 'addr': address, 'size': size, 'stream': stream, 'time_us': time_us,
                      'compile_context': ''.join(['N', '/A']), 'user_metadata': '', 'frames': list(stack)})
        live.append((address, size, stack))
        if len(live) > 64:
            a, s, st = live.pop((i * 7919) % len(live))
            for action in ('free_requested', 'free_completed'):
                time_us += 1
                trace.append({'action': action, 'addr': a, 'size': s, 'stream': stream, 'time_us': time_us,
                              'compile_context': ''.join(['N', '/A']), 'user_metadata': '', 'frames': list(st)})
    # One segment covering everything ever allocated, so the layout is valid.
    total = next_address - base
    total = (total + (2 << 20) - 1) // (2 << 20) * (2 << 20)
    blocks = []
    cursor = base
    for address, size, stack in sorted(live):
        if address > cursor:
            blocks.append({'address': cursor, 'size': address - cursor, 'requested_size': 0, 'state': 'inactive',
                           'frames': []})
        block = (size + 511) // 512 * 512
        blocks.append({'address': address, 'size': block, 'requested_size': size, 'state': 'active_allocated',
                       'frames': list(stack)})
        cursor = address + block
    if cursor < base + total:
        blocks.append({'address': cursor, 'size': base + total - cursor, 'requested_size': 0, 'state': 'inactive',
                       'frames': []})
    segments.append({'device': 0, 'address': base, 'total_size': total, 'stream': stream, 'segment_type': 'large',
                     'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': [],
                     'allocated_size': sum(b['size'] for b in blocks if b['state'] == 'active_allocated'),
                     'active_size': 0, 'requested_size': 0, 'blocks': blocks})
    snapshot = {'segments': segments, 'device_traces': [trace],
                'allocator_settings': {'PYTORCH_CUDA_ALLOC_CONF': '', 'max_split_size': -1,
                                       'garbage_collection_threshold': 0.0, 'expandable_segments': False,
                                       'roundup_power2_divisions': {1 << k: 0 for k in range(16)}},
                'external_annotations': []}
    with open(path, 'wb') as out:
        pickle.dump(snapshot, out, protocol=4)


def time_pickle_load(path):
    start = time.perf_counter()
    with open(path, 'rb') as f:
        pickle.load(f)
    return time.perf_counter() - start


def time_analyzer(analyzer, path, timeout=None):
    """Wall time, peak RSS (bytes) and CPU seconds (user + system) of one
    `summary` run in a child process; None past `timeout` seconds."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        try:
            os.execv(analyzer, [analyzer, 'summary', path])
        finally:
            os._exit(127)
    while True:
        waited, status, usage = os.wait4(pid, os.WNOHANG)
        if waited == pid:
            break
        if timeout is not None and time.perf_counter() - start > timeout:
            os.kill(pid, 9)
            os.wait4(pid, 0)
            return None
        time.sleep(0.01)
    elapsed = time.perf_counter() - start
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        sys.exit('%s summary %s failed (status %d)' % (analyzer, path, status))
    return elapsed, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime  # Linux reports KiB


def convert_synthetic(analyzer, prefix, events, fresh):
    """PREFIX.N.pickle written by our own convert from a synthetic recording."""
    binary = '%s.%d.bin' % (prefix, events)
    pickled = '%s.%d.pickle' % (prefix, events)
    synthetic = os.path.join(os.path.dirname(analyzer), 'cachealloc-synthetic')
    if fresh or not os.path.exists(binary):
        subprocess.run([synthetic, '--events', str(events), '--seed', '1', '--stacks', 'native', '-o', binary],
                       check=True, stdout=subprocess.DEVNULL)
    if fresh or not os.path.exists(pickled):
        subprocess.run([analyzer, 'convert', binary, '-o', pickled], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return pickled


def compare_one(path, analyzer, runs, timeout=None):
    """(size, best pickle.load, best summary or None, peak RSS, CPU of the best summary)."""
    size = os.path.getsize(path)
    python = min(time_pickle_load(path) for _ in range(runs))
    results = []
    for _ in range(runs):
        result = time_analyzer(analyzer, path, timeout)
        if result is None:
            return size, python, None, None, None
        results.append(result)
    best = min(results)
    return size, python, best[0], max(r[1] for r in results), best[2]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('pickle')
    parser.add_argument('analyzer')
    parser.add_argument('--runs', type=int, default=3)
    parser.add_argument('--make', type=int, metavar='N', help='first write a PyTorch-shaped pickle of N allocations')
    parser.add_argument('--frames', type=int, nargs=2, default=(2, 6), metavar=('MIN', 'MAX'))
    parser.add_argument('--convert', type=int, nargs='+', metavar='N',
                        help='time pickles of our own convert, N events each; PICKLE is their path prefix')
    parser.add_argument('--fresh', action='store_true', help='with --convert: make the files again')
    parser.add_argument('--timeout', type=float, help='give up on a summary run after this many seconds')
    args = parser.parse_args()
    if args.convert:
        print('| events | pickle | Python pickle.load | cachealloc summary | ratio | summary CPU (user+sys) '
              '| peak RSS of summary |')
        print('|---:|---:|---:|---:|---:|---:|---:|')
        for events in args.convert:
            path = convert_synthetic(args.analyzer, args.pickle, events, args.fresh)
            size, python, ours, rss, cpu = compare_one(path, args.analyzer, args.runs, args.timeout)
            if ours is None:
                print('| %d | %.1f MB | %.3f s | >%.0f s (stopped) | >%.2f | | |' %
                      (events, size / 1e6, python, args.timeout, args.timeout / python), flush=True)
                continue
            print('| %d | %.1f MB | %.3f s | %.3f s | %.3f | %.2f s | %.1f MB (%.2fx the file) |' %
                  (events, size / 1e6, python, ours, ours / python, cpu, rss / 1e6, rss / size), flush=True)
        print('best of %d each' % args.runs)
        return
    if args.make:
        make_pytorch_like(args.pickle, args.make, *args.frames)
    size, python, ours, rss, _ = compare_one(args.pickle, args.analyzer, args.runs)
    print('pickle:              %s (%.1f MB)' % (args.pickle, size / 1e6))
    print('python pickle.load:  %.3f s (best of %d)' % (python, args.runs))
    print('cachealloc summary:  %.3f s (best of %d)' % (ours, args.runs))
    print('ratio:               %.3f (target <= 0.1)' % (ours / python))
    print('analyzer peak RSS:   %.1f MB (%.2f x the file)' % (rss / 1e6, rss / size))


if __name__ == '__main__':
    main()
