"""Train a small model on cachealloc through PyTorch's pluggable-allocator API,
record its memory history, dump a snapshot and analyze it.

    python3 examples/pytorch_pluggable.py [path/to/libcachealloc.so] [path/to/cachealloc-analyze]

Two lines switch a PyTorch program to our allocator (before any CUDA tensor):

    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, 'cachealloc_torch_malloc', 'cachealloc_torch_free')
    torch.cuda.memory.change_current_allocator(alloc)

Recording, annotations, stats and dumps go through ctypes on the same library.
"""
import ctypes
import json
import os
import subprocess
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
lib_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, '..', 'build', 'lib', 'libcachealloc.so')
analyze = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, '..', 'build', 'bin', 'cachealloc-analyze')
lib_path = os.path.abspath(lib_path)

# 1. PyTorch allocates through cachealloc from here on.
allocator = torch.cuda.memory.CUDAPluggableAllocator(lib_path, 'cachealloc_torch_malloc', 'cachealloc_torch_free')
torch.cuda.memory.change_current_allocator(allocator)

# 2. The same library, for recording and stats.
lib = ctypes.CDLL(lib_path)


class HistoryOptions(ctypes.Structure):
    _fields_ = [('enabled', ctypes.c_int), ('max_entries', ctypes.c_uint64), ('stacks', ctypes.c_int),
                ('max_frames', ctypes.c_uint32), ('stacks_on_free', ctypes.c_int), ('dump_on_oom', ctypes.c_char_p)]


for name in ('cachealloc_memory_allocated', 'cachealloc_memory_reserved', 'cachealloc_max_memory_allocated',
             'cachealloc_max_memory_reserved'):
    getattr(lib, name).restype = ctypes.c_uint64
lib.cachealloc_last_error.restype = ctypes.c_char_p

options = HistoryOptions()
lib.cachealloc_history_options_init(ctypes.byref(options))
if lib.cachealloc_record_history(ctypes.byref(options)) != 0:
    sys.exit('record_history failed: ' + lib.cachealloc_last_error().decode())

# 3. A small convolutional network, a few training steps, each annotated.
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
    torch.nn.Flatten(), torch.nn.Linear(64 * 16, 10)).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(5):
    lib.cachealloc_annotate_begin(f'step {step}'.encode())
    x = torch.randn(256, 3, 64, 64, device='cuda')
    y = torch.randint(0, 10, (256,), device='cuda')
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    lib.cachealloc_annotate_end()
    print(f'step {step}: loss {loss.item():.4f}, allocated {lib.cachealloc_memory_allocated() / 2**20:.2f} MiB, '
          f'reserved {lib.cachealloc_memory_reserved() / 2**20:.2f} MiB')

peak = lib.cachealloc_max_memory_allocated()
snapshot = os.path.abspath('pytorch_pluggable.bin')
if lib.cachealloc_dump_snapshot(snapshot.encode()) != 0:
    sys.exit('dump failed: ' + lib.cachealloc_last_error().decode())
print(f'stats API: peak allocated {peak} bytes, peak reserved {lib.cachealloc_max_memory_reserved()} bytes')

# 4. Analyze the snapshot; its peak must agree with the stats API.
subprocess.run([analyze, snapshot], check=True)
summary = json.loads(subprocess.run([analyze, 'summary', snapshot, '--format', 'json'], check=True,
                                    capture_output=True, text=True).stdout)
print(f"snapshot: peak allocated {summary['peak_allocated']} bytes at event {summary['peak_allocated_event']}")
if summary['peak_allocated'] != peak:
    sys.exit(f"MISMATCH: the snapshot's peak {summary['peak_allocated']} != the stats API's {peak}")
print('the snapshot peak agrees with the stats API')
