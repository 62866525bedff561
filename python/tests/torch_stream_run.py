#!/usr/bin/env python3
"""A long real training run streamed through the torch extension, held to
PyTorch's own figures.

    python3 torch_stream_run.py --seconds 600 --stream run.stream --out run.json
    python3 torch_stream_run.py --check run.json --analyzer cachealloc-analyze

The first form installs cachealloc as PyTorch's allocator, records with
cachealloc.record(stream=...) from before the first CUDA tensor, and trains a
transformer on variable batch and sequence lengths for --seconds (targets
made on a second stream and handed over with record_stream, empty_cache()
every 500 steps). It writes memory_stats() at the end, the step count, the
recording's path and, every --checkpoint-seconds, the step number with the
allocator's current figures taken as the last thing inside that step's
annotation, as JSON.

The second form reads the stream with cachealloc-analyze and compares its
summary with memory_stats(): every allocation, free, segment allocation and
release kept (the counts equal PyTorch's cumulative counters), the figures
at the end and the peaks equal; and at each checkpoint, the state just after
that step's annotation ends (`summary --at`, the event found with `events
--kind annotation_end`) equal to the figures taken then, so that the stream
holds the run's memory through the run, not only at its end. Exit status 0
when all are equal, 1 if not.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time


# memory_stats() keys taken at each checkpoint, and the summary's figure each
# is held to.
CHECKPOINT_FIGURES = {
    "allocated_bytes.all.current": "allocated_at_end",
    "reserved_bytes.all.current": "reserved_at_end",
    "segment.all.current": "segments_at_end",
    "allocated_bytes.all.peak": "peak_allocated",
    "reserved_bytes.all.peak": "peak_reserved",
}


def train(args):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import cachealloc
    import cachealloc.torch
    cachealloc.torch.install()
    cachealloc.record(stream=args.stream, stacks=args.stacks, max_entries=100_000)
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    rng = random.Random(0)
    d_model, vocab = 512, 8000
    layer = nn.TransformerEncoderLayer(d_model=d_model, nhead=8, dim_feedforward=2048,
                                       batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.Embedding(vocab, d_model), nn.TransformerEncoder(layer, num_layers=6),
                          nn.Linear(d_model, vocab)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    side = torch.cuda.Stream()
    start = time.monotonic()
    step = 0
    checkpoints = []
    next_checkpoint = args.checkpoint_seconds
    while time.monotonic() - start < args.seconds:
        length = rng.choice([64, 96, 128, 200, 256, 384, 512, 700, 1024])
        batch = rng.choice([8, 16, 24, 32])
        with cachealloc.annotate("step %d" % step):
            tokens = torch.randint(0, vocab, (batch, length), device="cuda")
            with torch.cuda.stream(side):
                targets = torch.randint(0, vocab, (batch, length), device="cuda")
            torch.cuda.current_stream().wait_stream(side)
            targets.record_stream(torch.cuda.current_stream())
            loss = F.cross_entropy(model(tokens).view(-1, vocab), targets.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            del tokens, targets, loss
            if time.monotonic() - start >= next_checkpoint:
                next_checkpoint += args.checkpoint_seconds
                # The last thing inside the annotation: no allocator call
                # lies between these figures and the annotation's end.
                now = torch.cuda.memory_stats()
                checkpoints.append({"step": step, **{key: now[key] for key in CHECKPOINT_FIGURES}})
        step += 1
        if step % 500 == 0:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        if step % 1000 == 0:
            print("step %d, %.0f s, allocated %d, reserved %d" % (
                step, time.monotonic() - start, torch.cuda.memory_allocated(),
                torch.cuda.memory_reserved()), flush=True)
    torch.cuda.synchronize()
    seconds = time.monotonic() - start
    stats = torch.cuda.memory_stats()
    cachealloc.stop()
    with open(args.out, "w") as f:
        json.dump({"steps": step, "seconds": seconds, "stream": os.path.abspath(args.stream),
                   "memory_stats": stats, "checkpoints": checkpoints}, f)
    print("trained %d steps in %.1f s; stream %s (%d bytes)" % (
        step, seconds, args.stream, os.path.getsize(args.stream)), flush=True)


def check(args):
    with open(args.check) as f:
        run = json.load(f)
    stats = run["memory_stats"]
    t = time.monotonic()
    out = subprocess.run([args.analyzer, "summary", run["stream"], "--format", "json"],
                         capture_output=True, text=True)
    seconds = time.monotonic() - t
    if out.returncode != 0:
        print("summary failed (%d): %s" % (out.returncode, out.stderr.strip()))
        return 1
    summary = json.loads(out.stdout)
    events = summary["events"]
    pairs = [
        ("allocations recorded", events["alloc"], stats["allocation.all.allocated"]),
        ("frees recorded", events["free_requested"], stats["allocation.all.freed"]),
        ("segment allocations recorded", events["segment_alloc"], stats["num_device_alloc"]),
        ("segment releases recorded", events["segment_release"], stats["num_device_free"]),
        ("events dropped", summary["dropped_events"], 0),
        ("allocated at the end", summary["allocated_at_end"], stats["allocated_bytes.all.current"]),
        ("reserved at the end", summary["reserved_at_end"], stats["reserved_bytes.all.current"]),
        ("segments at the end", summary["segments_at_end"], stats["segment.all.current"]),
        ("peak allocated", summary["peak_allocated"], stats["allocated_bytes.all.peak"]),
        ("peak reserved", summary["peak_reserved"], stats["reserved_bytes.all.peak"]),
        ("peak active", summary["peak_active"], stats["active_bytes.all.peak"]),
        ("peak requested", summary["peak_requested"], stats["requested_bytes.all.peak"]),
    ]
    total = sum(v for k, v in events.items() if isinstance(v, int))
    print("stream: %s, %d bytes, %d events, %d training steps in %.1f s; summary read it in %.1f s" % (
        run["stream"], os.path.getsize(run["stream"]), total, run["steps"], run["seconds"], seconds))
    different = 0
    for name, ours, pytorch in pairs:
        same = ours == pytorch
        different += not same
        print("%-30s %16s %16s  %s" % (name, ours, pytorch, "equal" if same else "DIFFERENT"))
    compared = len(pairs)
    # The checkpoints: the state just after each checkpoint step's annotation.
    checkpoints = run.get("checkpoints", [])
    if checkpoints:
        out = subprocess.run([args.analyzer, "events", run["stream"], "--kind", "annotation_end", "--all-events",
                              "--format", "json"], capture_output=True, text=True)
        if out.returncode != 0:
            print("events failed (%d): %s" % (out.returncode, out.stderr.strip()))
            return 1
        step_end = {e["aux"]: e["event"] for e in json.loads(out.stdout)["events"]}
        t = time.monotonic()
        for point in checkpoints:
            name = "step %d" % point["step"]
            if name not in step_end:
                print("checkpoint %-18s no annotation_end in the stream  DIFFERENT" % name)
                different += 1
                compared += 1
                continue
            out = subprocess.run([args.analyzer, "summary", run["stream"], "--at", str(step_end[name]),
                                  "--format", "json"], capture_output=True, text=True)
            if out.returncode != 0:
                print("summary --at failed (%d): %s" % (out.returncode, out.stderr.strip()))
                return 1
            at = json.loads(out.stdout)
            wrong = [key for key, figure in CHECKPOINT_FIGURES.items() if at[figure] != point[key]]
            compared += len(CHECKPOINT_FIGURES)
            different += len(wrong)
            print("checkpoint %-18s event %10d: allocated %14d reserved %14d segments %5d  %s" % (
                name, step_end[name], at["allocated_at_end"], at["reserved_at_end"], at["segments_at_end"],
                "equal" if not wrong else "DIFFERENT: " + ", ".join(
                    "%s %s against %s" % (key, at[CHECKPOINT_FIGURES[key]], point[key]) for key in wrong)))
        print("%d checkpoints read in %.1f s" % (len(checkpoints), time.monotonic() - t))
    print("%s: %d figures compared, %d different" % ("EQUAL" if different == 0 else "NOT EQUAL",
                                                     compared, different))
    return 0 if different == 0 else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--stream", help="the streamed recording to write")
    parser.add_argument("--stacks", default="native", choices=["none", "native", "unwind"])
    parser.add_argument("--out", help="memory_stats() at the end, as JSON")
    parser.add_argument("--checkpoint-seconds", type=float, default=30,
                        help="take the allocator's current figures every this many seconds")
    parser.add_argument("--check", metavar="RUN_JSON", help="compare a finished run's stream with its memory_stats()")
    parser.add_argument("--analyzer", default="cachealloc-analyze")
    args = parser.parse_args()
    if args.check:
        return check(args)
    if not (args.stream and args.out):
        parser.error("a run needs --stream and --out")
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
