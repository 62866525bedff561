#!/usr/bin/env python3
"""Private pools on one allocator: CUDA graph captures, graph trees
(torch.compile's mode="reduce-overhead") and MemPools, with every
memory_stats() figure after every step, as JSON for compare_torch_runs.py.
Run each scenario on PyTorch's allocator and on ours, in separate processes:

  python3 torch_pool_probe.py --allocator pytorch    --scenario NAME --out pt.json
  python3 torch_pool_probe.py --allocator cachealloc --scenario NAME --out ca.json
  python3 compare_torch_runs.py pt.json ca.json

Scenarios:
  shared_pool        three captures sharing one pool, replays, graphs deleted one by one, empty_cache
  side_stream_warmup a training loop; a small MLP warmed up three times on a side stream,
                     captured with torch.cuda.graph, replayed five times; deleted, empty_cache
  graph_trees        torch.compile(mode="reduce-overhead") of two functions and two input
                     shapes (a tree of several graphs), trained with cudagraph_mark_step_begin
  compile_delete     a training loop, then a compiled two-layer MLP trained 8 steps, deleted,
                     gc and empty_cache
  mempool_graphs     a torch.cuda.MemPool used beside a graph capture; both released
"""
import argparse
import gc
import json
import os
import sys
import traceback

parser = argparse.ArgumentParser()
parser.add_argument("--allocator", choices=["pytorch", "cachealloc"], required=True)
parser.add_argument("--scenario", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--trace", help="also record the memory history and dump it here (PyTorch's pickle)")
args = parser.parse_args()
if args.allocator == "cachealloc":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import cachealloc.torch
    cachealloc.torch.install()
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

steps = []


def record(label):
    torch.cuda.synchronize()
    stats = {k: v for k, v in torch.cuda.memory_stats().items() if isinstance(v, int)}
    steps.append({"label": label, "stats": stats})


def train_loop(n=4, width=1024):
    model = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda").manual_seed(0)
    for i in range(n):
        x = torch.randn(256, width, device="cuda", generator=g)
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        record("train step %d" % i)
    return model, opt


def shared_pool():
    a = torch.randn(512, 512, device="cuda")
    record("input")
    pool = torch.cuda.graph_pool_handle()
    graphs, outs = [], []
    for k in range(3):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                (a @ a).relu_()
        torch.cuda.current_stream().wait_stream(s)
        record("warm-up %d" % k)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            t = a @ a
            u = torch.empty((k + 1) * 1024 * 1024, device="cuda")
            out = (t + 1).relu() + u[: t.numel()].view_as(t)
            del t, u
        graphs.append(g)
        outs.append(out)
        record("capture %d" % k)
    for r in range(2):
        for g in graphs:
            g.replay()
        record("replay %d" % r)
    while graphs:
        graphs.pop()
        outs.pop()
        gc.collect()
        record("graph deleted, %d left" % len(graphs))
    torch.cuda.empty_cache()
    record("empty_cache")


def side_stream_warmup():
    model, opt = train_loop()
    del model, opt
    gc.collect()
    record("training done")
    mlp = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)).cuda()
    x = torch.randn(128, 512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            y = mlp(x)
            record("side-stream warm-up %d" % i)
    torch.cuda.current_stream().wait_stream(s)
    del y
    record("warm-up done")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = mlp(x)
    record("captured")
    for i in range(5):
        g.replay()
        record("replay %d" % i)
    del g, static_y
    gc.collect()
    record("graph deleted")
    torch.cuda.empty_cache()
    record("empty_cache")


def graph_trees():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)).cuda()
    head = nn.Linear(256, 10).cuda()
    opt = torch.optim.SGD(list(model.parameters()) + list(head.parameters()), lr=0.05)
    body = torch.compile(model, mode="reduce-overhead")
    top = torch.compile(head, mode="reduce-overhead")
    g = torch.Generator().manual_seed(1)
    for step in range(10):
        batch = 64 if step % 2 == 0 else 96  # two shapes: two graphs per function
        x = torch.randn(batch, 256, generator=g).cuda()
        y = torch.randint(0, 10, (batch,), generator=g).cuda()
        torch.compiler.cudagraph_mark_step_begin()
        loss = F.cross_entropy(top(body(x)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        record("step %d (batch %d)" % (step, batch))
    del body, top, model, head, opt, loss
    gc.collect()
    torch.cuda.empty_cache()
    record("deleted, empty_cache")


def compile_delete():
    model, opt = train_loop()
    del model, opt
    gc.collect()
    record("training done")
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)).cuda()
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    compiled = torch.compile(mlp, mode="reduce-overhead")
    g = torch.Generator().manual_seed(2)
    for step in range(8):
        torch.compiler.cudagraph_mark_step_begin()
        x = torch.randn(128, 512, generator=g).cuda()
        loss = compiled(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        record("compiled step %d" % step)
    del compiled, mlp, opt, loss, x
    gc.collect()
    record("deleted")
    torch.cuda.empty_cache()
    record("empty_cache")


def mempool_graphs():
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        kept = [torch.empty(n * 1024 * 1024, dtype=torch.uint8, device="cuda") for n in (1, 3, 30)]
    record("MemPool allocations")
    a = torch.randn(1024, 1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        (a @ a).relu_()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = (a @ a).relu()
    record("captured beside the MemPool")
    g.replay()
    record("replayed")
    del kept[1]
    with torch.cuda.use_mem_pool(pool):
        kept.append(torch.empty(2 * 1024 * 1024, dtype=torch.uint8, device="cuda"))
    record("MemPool reuse")
    del g, out
    gc.collect()
    record("graph deleted")
    del kept
    gc.collect()
    record("MemPool tensors freed")
    del pool
    gc.collect()
    torch.cuda.empty_cache()
    record("MemPool deleted, empty_cache")


SCENARIOS = {f.__name__: f for f in (shared_pool, side_stream_warmup, graph_trees, compile_delete, mempool_graphs)}
result = {"allocator": args.allocator, "scenario": args.scenario, "steps": steps, "error": None}
try:
    if args.trace:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=1_000_000)
    record("start")
    SCENARIOS[args.scenario]()
    if args.trace:
        torch.cuda.memory._dump_snapshot(args.trace)
except Exception as error:  # reported, not hidden: the comparison then fails
    result["error"] = "".join(traceback.format_exception_only(type(error), error)).strip()[-800:]
with open(args.out, "w") as fh:
    json.dump(result, fh)
print("%s %s: %d steps%s" % (args.allocator, args.scenario, len(steps), " ERROR " + result["error"] if result["error"] else ""))
