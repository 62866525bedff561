#!/usr/bin/env python3
"""Drives every torch.cuda memory API the drop-in implements and writes what each
returned, as JSON. Run once on PyTorch's allocator and once after
cachealloc.torch.install(), in separate processes; compare_torch_runs.py then
checks that the two agree (PyTorch's allocator is the ground truth), and the
cachealloc run's own checks (snapshot, dump, graph refusal) are in its JSON.

  python3 torch_api_probe.py --allocator pytorch    --out pt.json
  python3 torch_api_probe.py --allocator cachealloc --out ca.json --analyzer build/bin/cachealloc-analyze
"""
import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile

parser = argparse.ArgumentParser()
parser.add_argument("--allocator", choices=["pytorch", "cachealloc"], required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--analyzer", default=None, help="cachealloc-analyze, to read the dumps")
args = parser.parse_args()

if args.allocator == "cachealloc":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import cachealloc
    import cachealloc.torch
    cachealloc.torch.install()

import torch  # noqa: E402

KEYS = ["allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
        "reserved_bytes.all.peak", "active_bytes.all.current", "active_bytes.all.peak",
        "inactive_split_bytes.all.current", "requested_bytes.all.current", "requested_bytes.all.peak",
        "segment.all.current", "segment.all.peak", "allocation.all.current", "allocation.all.allocated",
        "allocation.all.freed", "active.all.current", "inactive_split.all.current",
        "num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms",
        "allocated_bytes.small_pool.current", "allocated_bytes.large_pool.current",
        "reserved_bytes.small_pool.current", "reserved_bytes.large_pool.current"]

results = {"allocator": args.allocator, "steps": [], "checks": {}}


def record(label):
    s = torch.cuda.memory_stats()
    results["steps"].append({
        "label": label,
        "stats": {k: s.get(k) for k in KEYS},
        "memory_allocated": torch.cuda.memory_allocated(),
        "memory_reserved": torch.cuda.memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
    })


def check(name, ok, detail=""):
    results["checks"][name] = {"ok": bool(ok), "detail": str(detail)}


torch.cuda.init()
record("start")
a = torch.empty(10_000_000, dtype=torch.uint8, device="cuda")
b = torch.empty(1000, dtype=torch.float32, device="cuda")
c = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
record("three tensors")
del c
record("freed the 3 MiB one")
torch.cuda.reset_peak_memory_stats()
record("after reset_peak_memory_stats")
torch.cuda.reset_accumulated_memory_stats()
record("after reset_accumulated_memory_stats")
torch.cuda.empty_cache()
record("after empty_cache")
summary = torch.cuda.memory_summary()
check("memory_summary is a table", "Allocated memory" in summary or "allocated" in summary.lower(), summary[:200])

# record_stream: a block used on a side stream is not reused until that stream's work is done.
side = torch.cuda.Stream()
d = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
with torch.cuda.stream(side):
    torch.cuda._sleep(50_000_000)  # keeps the side stream busy
    d.add_(1)
d.record_stream(side)
del d
record("record_stream: freed while the side stream still runs")
e = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
record("record_stream: a new 5 MiB tensor while the old one waits")
torch.cuda.synchronize()
del e
f = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
record("record_stream: after synchronize")
del f

# The other way round: a side stream's tensor used on the default stream and
# freed there. PyTorch completes its free at the next request of any stream.
with torch.cuda.stream(side):
    g = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.current_stream().wait_stream(side)
g.add_(1)
g.record_stream(torch.cuda.current_stream())
del g
record("record_stream: a side stream's tensor freed while the default stream uses it")
torch.cuda.synchronize()
h = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
record("record_stream: the default stream's next request after synchronize completes it")
del h

# caching_allocator_alloc / _delete
p = torch.cuda.caching_allocator_alloc(7 << 20)
record("caching_allocator_alloc 7 MiB")
torch.cuda.caching_allocator_delete(p)
record("caching_allocator_delete")

# A CUDA graph: its allocations come from a private pool, kept while the graph lives.
static_in = torch.randn(1 << 20, device="cuda")
side_capture = torch.cuda.Stream()
side_capture.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side_capture):
    for _ in range(2):
        warm = (static_in * 2).relu()
    del warm
torch.cuda.current_stream().wait_stream(side_capture)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    tmp = static_in * 3
    static_out = (tmp + 1).relu()
    del tmp
record("CUDA graph captured")
static_in.fill_(1.0)
graph.replay()
torch.cuda.synchronize()
check("the captured graph replays", float(static_out[0]) == 4.0, float(static_out[0]))
record("CUDA graph replayed")
torch.cuda.empty_cache()
record("empty_cache while the graph lives")
del graph
torch.cuda.empty_cache()
record("graph deleted, empty_cache (its output still held)")
del static_out
torch.cuda.empty_cache()
record("graph output freed, empty_cache")

# torch.cuda.MemPool and use_mem_pool.
pool = torch.cuda.MemPool()
results["mempool_use_count_new"] = pool.use_count()
with torch.cuda.use_mem_pool(pool):
    in_pool = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    results["mempool_use_count_inside"] = pool.use_count()
outside = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
record("MemPool: one tensor in the pool, one outside")
results["mempool_snapshot_segments"] = len(pool.snapshot())
del in_pool
torch.cuda.empty_cache()
record("MemPool: its tensor freed, empty_cache while the pool lives")
del pool
torch.cuda.empty_cache()
record("MemPool deleted, empty_cache")
del outside

# mem_get_info
free, total = torch.cuda.mem_get_info()
check("mem_get_info", 0 < free <= total, (free, total))
results["mem_get_info_total"] = total

# set_per_process_memory_fraction, OOM as torch.cuda.OutOfMemoryError, and the OOM observer.
seen = []
torch._C._cuda_attach_out_of_memory_observer(lambda *a: seen.append(a))
del a, b
torch.cuda.empty_cache()
torch.cuda.set_per_process_memory_fraction(0.01)
results["memory_fraction"] = 0.01
try:
    big = torch.empty(int(total * 0.02), dtype=torch.uint8, device="cuda")
    check("OOM under a memory fraction", False, "no error")
except torch.cuda.OutOfMemoryError as error:
    check("OOM under a memory fraction", True, str(error).splitlines()[0][:200])
results["oom_observer_calls"] = len(seen)
results["oom_observer_device"] = seen[0][0] if seen else None
record("after the OOM")
small = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
record("a tensor under the fraction after the OOM")
del small
torch.cuda.set_per_process_memory_fraction(1.0)
torch.cuda.empty_cache()

# History: _record_memory_history, _snapshot, _dump_snapshot.
torch.cuda.memory._record_memory_history(max_entries=100000)
xs = [torch.empty(n << 16, dtype=torch.uint8, device="cuda") for n in range(1, 40)]
del xs[::2]
snap = torch.cuda.memory._snapshot()
stats = torch.cuda.memory_stats()
seg_total = sum(s["total_size"] for s in snap["segments"])
alloc_total = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
actions = {}
for trace in snap["device_traces"]:
    for entry in trace:
        actions[entry["action"]] = actions.get(entry["action"], 0) + 1
results["snapshot"] = {"segments": len(snap["segments"]), "reserved": seg_total, "allocated": alloc_total,
                       "actions": actions,
                       "stats_reserved": stats["reserved_bytes.all.current"],
                       "stats_allocated": stats["allocated_bytes.all.current"],
                       "stats_segments": stats["segment.all.current"]}
check("_snapshot segments sum to reserved", seg_total == stats["reserved_bytes.all.current"],
      (seg_total, stats["reserved_bytes.all.current"]))
check("_snapshot allocated blocks sum to allocated", alloc_total == stats["allocated_bytes.all.current"],
      (alloc_total, stats["allocated_bytes.all.current"]))
check("_snapshot has a trace", actions.get("alloc", 0) >= 39, actions)
# Python frames through PyTorch's own context hook (the default stacks='all').
me = os.path.basename(__file__)
trace_files = {f["filename"] for trace in snap["device_traces"] for e in trace for f in e.get("frames", [])}
block_files = {f["filename"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"
               for f in b.get("frames", [])}
trace_allocs = [e for trace in snap["device_traces"] for e in trace if e["action"] == "alloc"]
with_me = sum(1 for e in trace_allocs if any(f["filename"].endswith(me) for f in e.get("frames", [])))
results["snapshot"]["allocs_with_python_frames_of_this_script"] = with_me
check("_snapshot's trace has this script's Python frames", with_me >= 39, (with_me, len(trace_allocs)))
check("_snapshot's live blocks have this script's Python frames", any(x.endswith(me) for x in block_files),
      sorted(block_files)[:5])
# _record_memory_history's options, each against PyTorch's behaviour:
# context=None (no frames), stacks='python' (Python frames only), max_entries.
torch.cuda.memory._record_memory_history(enabled=None)
torch.cuda.memory._record_memory_history(context=None, max_entries=1000)
kept = [torch.empty(1 << 20, device="cuda") for _ in range(3)]
snap_none = torch.cuda.memory._snapshot()
results["context_none_frames"] = sum(len(e.get("frames", [])) for t in snap_none["device_traces"] for e in t)
results["context_none_allocs"] = sum(1 for t in snap_none["device_traces"] for e in t if e["action"] == "alloc")
torch.cuda.memory._record_memory_history(enabled=None)
torch.cuda.memory._record_memory_history(stacks="python", max_entries=1000)
kept += [torch.empty(1 << 20, device="cuda") for _ in range(3)]
snap_py = torch.cuda.memory._snapshot()
py_frames = [f for t in snap_py["device_traces"] for e in t if e["action"] == "alloc" for f in e.get("frames", [])]
results["stacks_python_non_python_frames"] = sum(1 for f in py_frames if not f["filename"].endswith(".py"))
results["stacks_python_has_script"] = any(f["filename"].endswith(os.path.basename(__file__)) for f in py_frames)
torch.cuda.memory._record_memory_history(enabled=None)
torch.cuda.memory._record_memory_history(max_entries=5)
kept += [torch.empty(1 << 20, device="cuda") for _ in range(20)]
results["max_entries_5_trace_length"] = sum(len(t) for t in torch.cuda.memory._snapshot()["device_traces"])
del kept
torch.cuda.memory._record_memory_history(enabled=None)
torch.cuda.memory._record_memory_history(max_entries=100000)

tmp = tempfile.mkdtemp()
pickle_path = os.path.join(tmp, "probe.pickle")
torch.cuda.memory._dump_snapshot(pickle_path)
with open(pickle_path, "rb") as fh:
    check("_dump_snapshot writes a pickle", isinstance(pickle.load(fh), dict))
for verb in ("stats", "trace"):
    r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", verb, pickle_path],
                       capture_output=True, text=True)
    check("_memory_viz %s accepts the pickle" % verb, r.returncode == 0, (r.stdout + r.stderr)[-300:])
stats = torch.cuda.memory_stats()  # at the dump
if args.analyzer:
    r = subprocess.run([args.analyzer, "summary", pickle_path, "--format", "json"], capture_output=True, text=True)
    ok = r.returncode == 0
    if ok:
        s = json.loads(r.stdout)
        ok = (s["allocated_at_end"] == stats["allocated_bytes.all.current"]
              and s["reserved_at_end"] == stats["reserved_bytes.all.current"]
              and s["segments_at_end"] == stats["segment.all.current"])
        detail = {k: s[k] for k in ("allocated_at_end", "reserved_at_end", "segments_at_end", "peak_allocated")}
    else:
        detail = r.stderr[-300:]
    check("our analyzer reads the pickle with memory_stats' figures", ok, detail)
if args.allocator == "cachealloc":
    torch.cuda.memory._record_memory_history(enabled=None)
    cachealloc.record(max_entries=10000)  # our API: unwound C++ stacks and Python frames
    with cachealloc.annotate("probe phase"):
        ys = [torch.empty(1 << 20, device="cuda") for _ in range(4)]
    del ys
    bin_path = os.path.join(tmp, "probe.bin")
    cachealloc.dump(bin_path)
    if args.analyzer:
        r = subprocess.run([args.analyzer, "summary", bin_path, "--format", "json"], capture_output=True, text=True)
        ok = r.returncode == 0
        detail = r.stderr[-300:]
        if ok:
            s = json.loads(r.stdout)
            st = torch.cuda.memory_stats()
            ok = s["allocated_at_end"] == st["allocated_bytes.all.current"] and \
                s["reserved_at_end"] == st["reserved_bytes.all.current"]
            detail = (s["allocated_at_end"], s["reserved_at_end"], st["allocated_bytes.all.current"])
        check("cachealloc.dump in our format reads back", ok, detail)
        # --all-frames: the default site filter leaves torch's own frames out.
        r = subprocess.run([args.analyzer, "top", bin_path, "--format", "json", "--all-frames", "--frames", "0"],
                           capture_output=True, text=True)
        sites = json.loads(r.stdout)["sites"] if r.returncode == 0 else []
        deepest = max((len(site["stack"]) for site in sites), default=0)
        # The probe allocates from several Python lines through at::empty: the
        # sites must tell them apart, with frames beyond our own library.
        beyond = any("cachealloc" not in frame for site in sites for frame in site["stack"])
        torch_frames = any(frame.startswith(("at::", "c10::", "torch::")) for site in sites for frame in site["stack"])
        check("our dump has native allocation sites through torch (at::, c10:: frames)", beyond and torch_frames,
              {"sites": len(sites), "deepest_stack": deepest,
               "first": sites[0]["stack"][:4] if sites else r.stderr[-200:]})
torch.cuda.memory._record_memory_history(enabled=None)

with open(args.out, "w") as fh:
    json.dump(results, fh, indent=1)
bad = [k for k, v in results["checks"].items() if not v["ok"]]
for k, v in results["checks"].items():
    print("%s %s: %s" % ("PASS" if v["ok"] else "FAIL", k, v["detail"][:160]))
sys.exit(1 if bad else 0)
