#!/usr/bin/env python3
"""torch.empty/del from Python, on PyTorch's allocator or on ours through the
extension (python/), with history off, with _record_memory_history
(stacks='all') and with stacks='python'. One process per allocator (the
allocator is chosen before CUDA starts):

  python3 bench/torch_extension_speed.py --allocator pytorch
  python3 bench/torch_extension_speed.py --allocator cachealloc
"""
import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--allocator", choices=["pytorch", "cachealloc"], required=True)
parser.add_argument("--pairs", type=int, default=200_000)
args = parser.parse_args()
if args.allocator == "cachealloc":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import cachealloc.torch
    cachealloc.torch.install()
import torch  # noqa: E402


def loop(pairs):
    empty = torch.empty
    for _ in range(1000):
        del_me = empty(4096, dtype=torch.uint8, device="cuda")
        del del_me
    t0 = time.perf_counter()
    for _ in range(pairs):
        x = empty(4096, dtype=torch.uint8, device="cuda")
        del x
    return (time.perf_counter() - t0) / pairs * 1e9


torch.cuda.init()
off = min(loop(args.pairs) for _ in range(3))
print("%s: torch.empty(4 KiB)/del, history off: %.0f ns per pair" % (args.allocator, off))
for stacks in ("python", "all"):
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks=stacks)
    on = min(loop(args.pairs // 4) for _ in range(3))
    torch.cuda.memory._record_memory_history(enabled=None)
    print("%s: torch.empty(4 KiB)/del, _record_memory_history(stacks=%r): %.0f ns per pair (%.2fx off)" %
          (args.allocator, stacks, on, on / off))
