#!/usr/bin/env python3
"""torch.compile(mode="reduce-overhead") (CUDA graph trees) on one allocator:
a small MLP trained for a few steps on fixed data; prints the losses as JSON.
Run it on PyTorch's allocator and on ours and compare the losses.

  python3 torch_compile_compare.py --allocator pytorch    --out pt_compile.json
  python3 torch_compile_compare.py --allocator cachealloc --out ca_compile.json
"""
import argparse
import json
import os
import sys
import traceback

parser = argparse.ArgumentParser()
parser.add_argument("--allocator", choices=["pytorch", "cachealloc"], required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()
if args.allocator == "cachealloc":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import cachealloc.torch
    cachealloc.torch.install()
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.manual_seed(0)
generator = torch.Generator().manual_seed(1)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
compiled = torch.compile(model, mode="reduce-overhead")
data = [(torch.randn(64, 256, generator=generator).cuda(), torch.randint(0, 10, (64,), generator=generator).cuda())
        for _ in range(4)]
result = {"allocator": args.allocator, "losses": [], "error": None}
try:
    for step in range(args.steps):
        torch.compiler.cudagraph_mark_step_begin()
        x, y = data[step % len(data)]
        loss = F.cross_entropy(compiled(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        result["losses"].append(round(float(loss.item()), 5))
except Exception as error:  # reported, not hidden: the comparison then fails
    result["error"] = "".join(traceback.format_exception_only(type(error), error)).strip()[-500:]
result["peak_reserved"] = torch.cuda.max_memory_reserved()
with open(args.out, "w") as fh:
    json.dump(result, fh)
print("%s: losses %s%s" % (args.allocator, result["losses"], " ERROR " + result["error"] if result["error"] else ""))
