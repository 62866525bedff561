#!/usr/bin/env python3
"""Compares two runs of the same script, one on PyTorch's allocator (the
ground truth) and one on cachealloc's: every figure of every step must be
equal. Prints one line per difference and exits 1 when there is any.

  python3 compare_torch_runs.py pt.json ca.json
"""
import json
import sys

pt, ca = (json.load(open(p)) for p in sys.argv[1:3])
differences = 0
compared = 0
if len(pt["steps"]) != len(ca["steps"]):
    print("DIFFERENT number of steps: %d vs %d" % (len(pt["steps"]), len(ca["steps"])))
    differences += 1


def flat(step):
    out = {k: v for k, v in step.items() if k not in ("label", "stats", "loss", "graph_out")}
    out.update(step.get("stats", {}))
    return out


# The loss is not an allocator figure: kernels with atomics (embedding
# backward) may round differently from run to run, on either allocator. It
# must agree to 1e-3 relative; it is reported, not counted as a memory figure.
worst_loss = 0.0
for a, b in zip(pt["steps"], ca["steps"]):
    if "loss" in a and "loss" in b:
        worst_loss = max(worst_loss, abs(a["loss"] - b["loss"]) / max(abs(a["loss"]), 1e-12))
if any("loss" in s for s in pt["steps"]):
    print("loss: largest relative difference %.2e (%s)" % (worst_loss, "agrees" if worst_loss < 1e-3 else "DIFFERENT"))
    if worst_loss >= 1e-3:
        differences += 1


for i, (a, b) in enumerate(zip(pt["steps"], ca["steps"])):
    fa, fb = flat(a), flat(b)
    for key in sorted(set(fa) | set(fb)):
        compared += 1
        if fa.get(key) != fb.get(key):
            differences += 1
            print("step %d (%s) %s: pytorch %s, cachealloc %s" % (i, a.get("label", ""), key, fa.get(key), fb.get(key)))
for key in ("oom_observer_calls", "oom_observer_device", "mempool_use_count_new", "mempool_use_count_inside",
            "mempool_snapshot_segments", "context_none_frames", "context_none_allocs",
            "stacks_python_non_python_frames", "stacks_python_has_script", "max_entries_5_trace_length"):
    if key in pt or key in ca:
        compared += 1
        if pt.get(key) != ca.get(key):
            differences += 1
            print("%s: pytorch %s, cachealloc %s" % (key, pt.get(key), ca.get(key)))
print("%s: %d figures over %d steps compared, %d different" %
      ("EQUAL" if differences == 0 else "DIFFERENT", compared, len(pt["steps"]), differences))
sys.exit(1 if differences else 0)
