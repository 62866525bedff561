"""What recording Python frames costs per allocation (docs/PERFORMANCE.md):
cached 4 KiB alloc+free pairs through libcachealloc.so on the simulated
device, made from Python code DEPTH frames deep, with memory history on and
stacks none, python, native+python (and native, for reference). Each round
runs every mode once, in turn; each mode reports its best round.

    python3 bench/python_frames.py BUILD/lib BUILD/lib/libbench_python_frames_loop.so [PAIRS] [ROUNDS]

Two loops: the pairs made inside one C call (bench_pairs: the recorder's own
cost, no Python call per pair), and one ctypes call per malloc and per free
(what a Python program pays, Python's call overhead included, so noisier).
PyTorch's own figure needs torch on a GPU: bench/torch_history.py
(stacks='python' and 'all' against history off, per pair from Python).
"""
import ctypes
import os
import sys
import time

LIB, LOOP = sys.argv[1], sys.argv[2]
PAIRS = int(sys.argv[3]) if len(sys.argv) > 3 else 200_000
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 7
os.environ.setdefault("CACHEALLOC_DEVICE", "simulated")
MODES = {"off": None, "none": 0, "native": 1, "python": 3, "native+python": 4}

ca = ctypes.CDLL(os.path.join(LIB, "libcachealloc.so"))
ca.cachealloc_malloc.restype = ctypes.c_void_p
ca.cachealloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
ca.cachealloc_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
python_frames = ctypes.PyDLL(os.path.join(LIB, "libcachealloc_python.so"))
assert python_frames.cachealloc_python_install() == 0
loop = ctypes.CDLL(LOOP)
loop.bench_pairs.restype = ctypes.c_uint64
loop.bench_pairs.argtypes = [ctypes.c_uint64]


class HistoryOptions(ctypes.Structure):
    _fields_ = [("enabled", ctypes.c_int), ("max_entries", ctypes.c_uint64), ("stacks", ctypes.c_int),
                ("max_frames", ctypes.c_uint32), ("stacks_on_free", ctypes.c_int), ("dump_on_oom", ctypes.c_char_p)]


def record(mode):
    options = HistoryOptions()
    ca.cachealloc_history_options_init(ctypes.byref(options))
    options.enabled = MODES[mode] is not None
    options.stacks = MODES[mode] or 0
    options.max_frames = 64  # every frame of the deepest stack: the costliest case
    options.max_entries = 1_000_000
    assert ca.cachealloc_record_history(ctypes.byref(options)) == 0


def c_loop():
    return loop.bench_pairs(PAIRS) / PAIRS


def ctypes_loop():
    malloc, free = ca.cachealloc_malloc, ca.cachealloc_free
    n = PAIRS // 4
    start = time.perf_counter_ns()
    for _ in range(n):
        free(malloc(4096, 0), 0, 0)
    return (time.perf_counter_ns() - start) / n


def at_depth(depth, body):
    """body() called with `depth` Python frames of ours on the stack."""
    if depth <= 1:
        return body()
    return at_depth(depth - 1, body)


def measure(depth, body):
    best = {mode: float("inf") for mode in MODES}
    for _ in range(ROUNDS):
        for mode in MODES:
            record(mode)
            at_depth(depth, body)  # warm: the thread's caches, the stack table
            best[mode] = min(best[mode], at_depth(depth, body))
    return best


def main():
    base = len(__import__("inspect").stack())  # frames below at_depth: the script's own
    print("cached 4 KiB pairs, %d pairs, best of %d rounds; ns per pair, and beyond history on without stacks"
          % (PAIRS, ROUNDS))
    for depth in (10, 30):
        for name, body in (("C loop", c_loop), ("ctypes loop", ctypes_loop)):
            best = measure(depth - base, body)
            print("depth %2d, %-11s " % (depth, name) + "  ".join(
                "%s %.1f (%+.1f)" % (mode, best[mode], best[mode] - best["none"]) for mode in MODES), flush=True)
    record("off")


main()
