#!/usr/bin/env python3
"""A real training run for the drop-in comparison: a transformer on variable
sequence lengths, a second stream whose tensors are handed over with
record_stream, and empty_cache() halfway. After every step it records
torch.cuda.memory_stats() (allocated, reserved, active, inactive_split,
requested, segment, num_device_alloc, num_device_free: current and peak) and
the loss, as JSON in compare_torch_runs.py's shape.

  python3 torch_train_compare.py --allocator pytorch    --out pt_train.json
  python3 torch_train_compare.py --allocator cachealloc --out ca_train.json
  python3 compare_torch_runs.py pt_train.json ca_train.json

A small head is captured as a CUDA graph before the first step and replayed
at every step (its memory lives in the graph's private pool).
"""
import argparse
import json
import os
import random
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--allocator", choices=["pytorch", "cachealloc"], required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=40)
args = parser.parse_args()
if args.allocator == "cachealloc":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import cachealloc.torch
    cachealloc.torch.install()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.manual_seed(0)
rng = random.Random(0)
d_model, vocab = 512, 4000
layer = nn.TransformerEncoderLayer(d_model=d_model, nhead=8, dim_feedforward=2048, batch_first=True, dropout=0.0)
model = nn.Sequential(nn.Embedding(vocab, d_model), nn.TransformerEncoder(layer, num_layers=4),
                      nn.Linear(d_model, vocab)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
side = torch.cuda.Stream()
# The captured graph: a head replayed at every step on fixed-size inputs.
head = nn.Linear(d_model, 16).cuda()
static_x = torch.zeros(32, d_model, device="cuda")
warmup = torch.cuda.Stream()
warmup.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(warmup), torch.no_grad():
    for _ in range(3):
        head(static_x)
torch.cuda.current_stream().wait_stream(warmup)
graph = torch.cuda.CUDAGraph()
with torch.no_grad(), torch.cuda.graph(graph):
    static_y = head(static_x).softmax(-1)
KEYS = []
for stat in ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
             "allocation", "segment", "active", "inactive_split"):
    for pool in ("all", "small_pool", "large_pool"):
        for kind in ("current", "peak"):
            KEYS.append("%s.%s.%s" % (stat, pool, kind))
KEYS += ["num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms"]
steps = []
times = []
for step in range(args.steps):
    length = rng.choice([64, 96, 128, 200, 256, 384, 512, 700])
    batch = rng.choice([8, 16, 24, 32])
    t0 = time.perf_counter()
    tokens = torch.randint(0, vocab, (batch, length), device="cuda")
    with torch.cuda.stream(side):
        targets = torch.randint(0, vocab, (batch, length), device="cuda")  # made on the side stream
    torch.cuda.current_stream().wait_stream(side)
    targets.record_stream(torch.cuda.current_stream())
    logits = model(tokens)
    with torch.no_grad():
        static_x.copy_(logits[:, 0, :d_model].float().repeat(32 // batch + 1, 1)[:32])
        graph.replay()
    loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    del tokens, targets, logits
    if step == args.steps // 2:
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    s = torch.cuda.memory_stats()
    row = {"label": "step %d (batch %d, length %d)" % (step, batch, length), "stats": {k: s.get(k) for k in KEYS},
           "loss": round(float(loss.item()), 4), "graph_out": round(float(static_y.sum().item()), 2)}
    steps.append(row)
    del loss
result = {"allocator": args.allocator, "steps": steps,
          "step_time_s_median": sorted(times[5:])[len(times[5:]) // 2] if len(times) > 5 else None}
with open(args.out, "w") as fh:
    json.dump(result, fh, indent=1)
print("%s: %d steps, median step %.2f ms, final loss %s, peak reserved %d" %
      (args.allocator, len(steps), 1000 * (result["step_time_s_median"] or 0), steps[-1]["loss"],
       steps[-1]["stats"]["reserved_bytes.all.peak"]))
