#!/usr/bin/env python3
"""Exact categories through the extension, held to torch's own figures.

    python3 torch_categories_check.py --out DIR [--analyzer cachealloc-analyze]

Three models of known size (an MLP under SGD with momentum, a CNN with
batch norm under Adam, a transformer encoder under AdamW), each recorded by
cachealloc.record() with cachealloc.track_categories(). After two training
steps, a third is dumped at three moments and each dump's summary (the
requested bytes of each category at its end) is compared with torch:

- after the forward pass: parameter = the sum of numel() * element_size()
  over the parameters and buffers; activation = the distinct storages that
  torch.autograd.graph.saved_tensors_hooks saw in the same forward pass,
  counted by this script's own hook on an identical pass (and loss) just
  before;
- after backward: gradient = the sum over the parameters' .grad;
- after the optimizer step: optimizer_state = the sum over the CUDA tensors
  in optimizer.state.

Each model also writes PyTorch's pickle of the same run (DIR/NAME.pickle),
for comparing the categories the analyzer infers with the exact ones.
Exit status 0 when every figure is equal.
"""
import argparse
import gc
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cachealloc  # noqa: E402
import cachealloc.torch  # noqa: E402

cachealloc.torch.install()
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def mlp():
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(),
                          nn.Linear(4096, 1000)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, opt, lambda: (torch.randn(256, 1024, device="cuda"), torch.randint(0, 1000, (256,), device="cuda"))


def cnn():
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt, lambda: (torch.randn(64, 3, 64, 64, device="cuda"), torch.randint(0, 10, (64,), device="cuda"))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8000, 512)
        layer = nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.1, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.head = nn.Linear(512, 8000)

    def forward(self, tokens):
        return self.head(self.body(self.embed(tokens))).flatten(0, 1)


def transformer():
    model = Encoder().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt, lambda: (torch.randint(0, 8000, (16, 256), device="cuda"),
                                torch.randint(0, 8000, (16 * 256,), device="cuda"))


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def saved_bytes_of_forward(model, x, y, parameter_addresses):
    """The distinct CUDA storages saved for backward by one forward pass and
    its loss, in bytes, as saved_tensors_hooks sees them (parameters apart)."""
    seen = {}

    def pack(t):
        if t.is_cuda:
            s = t.untyped_storage()
            if s.data_ptr() not in parameter_addresses:
                seen[s.data_ptr()] = s.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = F.cross_entropy(model(x), y)
    del out
    return sum(seen.values())


def summary(analyzer, path):
    out = subprocess.run([analyzer, "summary", path, "--format", "json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("summary of %s failed: %s" % (path, out.stderr.strip()))
    return {c["category"]: c for c in json.loads(out.stdout)["categories"]}


def run(name, build, args):
    torch.manual_seed(0)
    cachealloc.record(stacks="none", python=True)
    model, opt, batch = build()
    tracker = cachealloc.track_categories(model, opt)
    for _ in range(2):
        x, y = batch()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del x, y, loss
    x, y = batch()
    parameter_addresses = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    torch.manual_seed(1)  # the same dropout masks' shapes either way; their values do not matter
    expected_saved = saved_bytes_of_forward(model, x, y, parameter_addresses)
    opt.zero_grad(set_to_none=True)
    tracker.forget_saved()
    loss = F.cross_entropy(model(x), y)
    torch.cuda.synchronize()
    moments = {}
    path = os.path.join(args.out, name + ".forward.bin")
    cachealloc.dump(path)
    moments["forward"] = path
    loss.backward()
    torch.cuda.synchronize()
    path = os.path.join(args.out, name + ".backward.bin")
    cachealloc.dump(path)
    moments["backward"] = path
    opt.step()
    torch.cuda.synchronize()
    path = os.path.join(args.out, name + ".step.bin")
    cachealloc.dump(path)
    moments["step"] = path
    cachealloc.dump(os.path.join(args.out, name + ".pickle"))
    tracker.stop()
    cachealloc.stop()

    parameters = tensor_bytes(list(model.parameters()) + list(model.buffers()))
    gradients = tensor_bytes([p.grad for p in model.parameters() if p.grad is not None])
    state = tensor_bytes([v for s in opt.state.values() for v in s.values()
                          if isinstance(v, torch.Tensor) and v.is_cuda])
    checks = [
        ("forward", "parameter", parameters, "sum of numel*element_size over parameters and buffers"),
        ("forward", "activation", expected_saved, "storages saved_tensors_hooks saw"),
        ("backward", "gradient", gradients, "sum over .grad"),
        ("step", "optimizer_state", state, "sum over optimizer.state (CUDA tensors)"),
        ("step", "parameter", parameters, "parameters after the step"),
    ]
    different = 0
    for moment, category, expected, what in checks:
        got = summary(args.analyzer, moments[moment])[category]
        ours = got.get("requested_at_end")
        same = ours == expected
        different += not same
        print("%-12s %-9s %-16s %14s %14s  %-7s %s (%s)" % (name, moment, category, ours, expected,
                                                          "equal" if same else "DIFFERENT", what, got.get("source")))
    print("%-12s hook saw %d saved bytes in the recorded pass (the independent count: %d)" % (
        name, tracker.saved_bytes, expected_saved))
    del model, opt, x, y, loss, tracker
    gc.collect()  # the model's tensors go before the next model's recording starts
    torch.cuda.empty_cache()
    return different


MODELS = {"mlp_sgd": mlp, "cnn_adam": cnn, "encoder_adamw": transformer}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--analyzer", default="cachealloc-analyze")
    parser.add_argument("--model", choices=sorted(MODELS), help="one model (each runs in a process of its own)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.model:
        return 1 if run(args.model, MODELS[args.model], args) else 0
    # One process per model: nothing of one model is live in the next one's recording.
    failed = 0
    for name in MODELS:
        failed += subprocess.run([sys.executable, os.path.abspath(__file__), "--model", name, "--out", args.out,
                                  "--analyzer", args.analyzer]).returncode != 0
    print("%s: %d of %d models with a figure different" % ("EQUAL" if failed == 0 else "NOT EQUAL", failed, len(MODELS)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
