"""A fragmenting workload for the what-if replay, for torch 2.11 on the H200.

Step i allocates an activation of A_i = 256 MiB + 6 MiB * i (a fresh segment:
it is larger than every free block), frees the previous activation, and keeps
a tensor of A_i / 2 + 2 MiB, which best fit carves out of the block just freed
(the only free block that large). Every segment is thus pinned by its keeper
with about half of it free, and the next, larger activation fits none of those
halves: under the default settings reserved memory grows with the sum of the
activations (about 14.7 GiB) while about 8 GiB is allocated, and under an
11 GiB cap the allocator cannot free the pinned segments and runs out of
memory. Expandable segments keep reserved near what is live. Only torch.empty
is used: no kernels, no library workspaces, so the allocator sees exactly
these requests. (The same workload through our allocator on the simulated
device is tests/test_what_if_replay.cpp's "fragmenting workload" case.)

  python3 workload.py record OUT.pickle
      records the run under the environment's PYTORCH_CUDA_ALLOC_CONF (no cap)
  python3 workload.py run CAP_BYTES [OUT.pickle]
      runs it under set_per_process_memory_fraction(CAP_BYTES / total) and prints
      one JSON line: peak reserved and allocated, segments, device allocs/frees,
      retries, whether it ran out of memory and at which step
"""
import json
import os
import sys

import torch

MiB = 1 << 20
STEPS = 40


def workload(on_step=None):
    keepers = []
    previous = None
    for step in range(STEPS):
        if on_step:
            on_step(step)
        size = 256 * MiB + step * 6 * MiB
        x = torch.empty(size, dtype=torch.uint8, device="cuda")
        del previous
        keepers.append(torch.empty(size // 2 + 2 * MiB, dtype=torch.uint8, device="cuda"))
        previous = x
    return keepers


def figures(oom_step):
    s = torch.cuda.memory_stats()
    return {
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "total_memory": torch.cuda.mem_get_info()[1],
        "peak_reserved": s["reserved_bytes.all.peak"],
        "peak_allocated": s["allocated_bytes.all.peak"],
        "segments": s["segment.all.current"],
        "device_allocs": s["num_device_alloc"],
        "device_frees": s["num_device_free"],
        "retries": s["num_alloc_retries"],
        "ooms": s["num_ooms"],
        "oom_step": oom_step,
    }


def main():
    mode = sys.argv[1]
    if mode == "record":
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
        keep = workload()
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(sys.argv[2])
        print(json.dumps(figures(None)))
        del keep
        return
    cap = int(sys.argv[2])
    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction(cap / total)
    if len(sys.argv) > 3:
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    state = {"step": None}
    oom_step = None
    try:
        keep = workload(lambda step: state.update(step=step))
    except torch.OutOfMemoryError:
        oom_step = state["step"]
    torch.cuda.synchronize()
    if len(sys.argv) > 3:
        torch.cuda.memory._dump_snapshot(sys.argv[3])
    print(json.dumps(figures(oom_step)))


if __name__ == "__main__":
    main()
