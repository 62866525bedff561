# Ground-truth corpus for cachealloc's PyTorch importer and replay.
#
# Each case runs a small, deterministic GPU workload under
# torch.cuda.memory._record_memory_history and writes
#   OUTDIR/NAME.pickle      torch.cuda.memory._dump_snapshot of the run
#   OUTDIR/NAME.stats.json  PyTorch's own figures at the dump AND at the end of every step
# so that a C++ test can replay the trace and compare its figures with PyTorch's
# at each step marker.
#
# Usage:
#   python3 make_corpus.py OUTDIR [CASE ...]    all cases when none is named
#   python3 make_corpus.py --list               the case names
#   python3 make_corpus.py --case NAME OUTDIR   one case in this process (what the parent runs)
# The parent runs every case in its own subprocess with the case's
# PYTORCH_CUDA_ALLOC_CONF in the environment (it must be set before CUDA
# initializes; PYTORCH_ALLOC_CONF, which would override it, is removed), prints
# one line per case (name, pickle size in bytes, seconds, or the error) followed
# by the case's own notes, and exits non-zero if any case failed. It runs them all.
#
# Steps. Each step is a `with step(name):` block:
#   entry: gc.collect(); torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats();
#          enter torch.profiler.record_function(name)     -> 'START' annotation
#   exit:  leave record_function                           -> 'END' annotation
#          torch.cuda.synchronize(); read torch.cuda.memory_stats()
# Nothing touches the GPU allocator between the END annotation and the read,
# so a step's figures are the state right after its END annotation, and its
# "peak" figures are the peaks since its START. Step names are unique within a
# case. In the pickle the annotations are the 'external_annotations' entries
# ({'name', 'stage': 'START'|'END', 'device', 'time_us'}); PyTorch's own
# record_function scopes (e.g. 'Optimizer.step#Adam.step') show up there too,
# so match steps by name. Frees deferred by record_stream() complete at the
# allocator's next call after the stream's work is done, not at synchronize(),
# so a step can end with blocks still active_pending_free.
#
# NAME.stats.json (indent=1, sort_keys=True):
# {
#  "case": NAME,
#  "torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(),
#  "alloc_conf": the PYTORCH_CUDA_ALLOC_CONF string, or "",
#  "history": {"context": "all" | null, "stacks": "python" | "all", "max_entries": int},
#  "dump": {every key of torch.cuda.memory_stats(): int, ..., "device_free": int, "device_total": int},
#          read right after _dump_snapshot; device_free/total from torch.cuda.mem_get_info()
#  "steps": [{"name": str, "device": int, "stats": {every key of torch.cuda.memory_stats(): int}}, ...],
#          in run order; no mem_get_info here (it may create a context)
#  "extra": {...}           only some cases, e.g. the memory fraction and the cap in bytes
#  "dump_devices": {"0": {...}, "1": {...}}   only two_devices: "dump" for every device
# }
#
# Cases: stacks_all, stacks_python, no_context, expandable, expandable_maxsplit,
# streams, ring_overflow, oom_retry, empty_cache_mid, roundup_gc, roundup_list,
# cuda_graph, varlen_transformer, two_devices; and the long runs, shaped like
# users' traces: long_train, long_ring_overflow (begins mid-run), long_expandable,
# long_rank0 and long_rank1 (two processes of one job on one GPU).
#
# MISSING FROM THE CORPUS: the two-device case. Only single-GPU machines were
# available when the corpus was made, so case_two_devices (below, clearly
# marked) skips itself with a message when torch.cuda.device_count() < 2; run
# it on a two-GPU machine to add two_devices.pickle.
#
# Made for PyTorch 2.11 (CUDA 13.0), Python 3.12, one NVIDIA H200. Every case is
# seeded (torch.manual_seed, random.Random) and cuDNN runs deterministic.
import contextlib
import gc
import json
import math
import os
import pickle
import random
import subprocess
import sys
import time
from collections import Counter

SCRIPT = os.path.abspath(__file__)
SEED = 1234
MiB = 2 ** 20
GiB = 2 ** 30
SKIP_RC = 77                    # a child's exit status for "skipped"
CASE_TIMEOUT_S = 600
SIZE_TARGET = 400 * 1000        # pickles above this get flagged
CONF_VARS = ('PYTORCH_CUDA_ALLOC_CONF', 'PYTORCH_ALLOC_CONF', 'PYTORCH_HIP_ALLOC_CONF')

torch = nn = F = None           # imported in the child only, once PYTORCH_CUDA_ALLOC_CONF is settled
DEV = 'cuda'

STEPS = []                      # what step() recorded, in order
EXTRA = {}                      # case-specific facts for "extra" in the stats.json
PROBLEMS = []                   # failed expect() checks: the case fails, its files are kept


def say(*args):
    print(*args, flush=True)


class SkipCase(Exception):
    pass


# --- shared helpers -------------------------------------------------------------------

def figures(device=None, at_dump=False):
    """The whole torch.cuda.memory_stats() dict (ints); at the dump also mem_get_info()."""
    stats = {k: int(v) if isinstance(v, (int, float)) else v
             for k, v in torch.cuda.memory_stats(device).items()}
    if at_dump:
        free, total = torch.cuda.mem_get_info(device)
        stats['device_free'], stats['device_total'] = int(free), int(total)
    return stats


@contextlib.contextmanager
def step(name, device=None):
    """One step: START/END annotations around the body, then PyTorch's figures."""
    assert all(s['name'] != name for s in STEPS), 'step names must be unique: ' + name
    gc.collect()                # frees of cyclic garbage happen here, outside any step
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    with torch.profiler.record_function(name):
        yield
    # Only synchronize and the stats read between the END annotation and the figures.
    torch.cuda.synchronize(device)
    index = torch.cuda.current_device() if device is None else torch.device('cuda', device).index
    STEPS.append({'name': name, 'device': index, 'stats': figures(device)})


def last(key):
    """A figure of the step that ended last."""
    return STEPS[-1]['stats'][key]


def expect(ok, what):
    say(('ok: ' if ok else 'FAILED: ') + what)
    if not ok:
        PROBLEMS.append(what)


def alloc(nbytes, device=None):
    """A tensor of exactly nbytes bytes."""
    return torch.empty(int(nbytes), dtype=torch.uint8, device=device or DEV)


def cap_memory(cap_bytes):
    """set_per_process_memory_fraction so that the cap is about cap_bytes on this GPU."""
    total = torch.cuda.get_device_properties(DEV).total_memory
    fraction = cap_bytes / total
    torch.cuda.set_per_process_memory_fraction(fraction)
    EXTRA.update(memory_fraction=fraction, cap_bytes=int(fraction * total), total_memory=int(total))
    return fraction


def dump(name, spec, outdir):
    """Dump the snapshot, read the figures at once, write NAME.stats.json."""
    torch.cuda.synchronize()
    path = os.path.join(outdir, name + '.pickle')
    torch.cuda.memory._dump_snapshot(path)
    at_dump = figures(at_dump=True)
    doc = {'case': name, 'torch': str(torch.__version__), 'cuda': torch.version.cuda,
           'device': torch.cuda.get_device_name(), 'alloc_conf': os.environ.get('PYTORCH_CUDA_ALLOC_CONF', ''),
           'history': spec['history'], 'dump': at_dump, 'steps': STEPS}
    if spec['devices'] > 1:
        doc['dump_devices'] = {str(d): at_dump if d == torch.cuda.current_device() else figures(d, at_dump=True)
                               for d in range(spec['devices'])}
    if EXTRA:
        doc['extra'] = EXTRA
    with open(os.path.join(outdir, name + '.stats.json'), 'w') as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write('\n')
    return path


def check_pickle(path, conf):
    """What the C++ side relies on: one START and one END annotation per step, the settings."""
    with open(path, 'rb') as f:
        snap = pickle.load(f)
    annotations = snap.get('external_annotations', [])
    for stage in ('START', 'END'):
        seen = Counter(a.get('name') for a in annotations if a.get('stage') == stage)
        wrong = [s['name'] for s in STEPS if seen[s['name']] != 1]
        expect(not wrong, f'one {stage} annotation per step' + (f' (not so for {wrong})' if wrong else ''))
    if conf:
        got = snap.get('allocator_settings', {}).get('PYTORCH_CUDA_ALLOC_CONF')
        expect(got == conf, f'allocator_settings has PYTORCH_CUDA_ALLOC_CONF={got!r}')
    events = sum(len(t) for t in snap.get('device_traces', []))
    say(f'{len(STEPS)} steps, {events} trace entries, {len(snap.get("segments", []))} segments, '
        f'{len(annotations)} annotations')


# --- the cases --------------------------------------------------------------------------

CASES = {}


def case(name, conf='', context='all', stacks='python', max_entries=100_000, devices=1):
    """Register a case. It returns what must stay alive at the dump."""
    def register(fn):
        CASES[name] = {'fn': fn, 'conf': conf, 'devices': devices,
                       'history': {'context': context, 'stacks': stacks, 'max_entries': max_entries}}
        return fn
    return register


@case('stacks_all', context='all', stacks='all')
def case_stacks_all():
    """Small conv net training with Python and C++ stacks (stacks='all')."""
    with step('init'):
        net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Flatten(), nn.Linear(64 * 8 * 8, 10)).to(DEV)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    for i in range(3):
        with step(f'train_{i}'):
            x = torch.randn(32, 3, 32, 32, device=DEV)
            y = torch.randint(0, 10, (32,), device=DEV)
            F.cross_entropy(net(x), y).backward()
            opt.step()
            opt.zero_grad()
    return net, opt


@case('stacks_python', context='all', stacks='python')
def case_stacks_python():
    """GRU training with Adam over sequences of different lengths."""
    with step('init'):
        gru = nn.GRU(128, 256, num_layers=2, batch_first=True).to(DEV)
        opt = torch.optim.Adam(gru.parameters(), lr=1e-3)
    for i, seq in enumerate([20, 45, 30, 60]):
        with step(f'train_{i}_seq{seq}'):
            out, _ = gru(torch.randn(16, seq, 128, device=DEV))
            out.pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    return gru, opt


@case('no_context', context=None, stacks='python')
def case_no_context():
    """context=None: trace entries without frames."""
    with step('alloc'):
        a = [torch.empty(2 ** k, device=DEV) for k in range(4, 27)]     # 64 B .. 256 MiB
    with step('free_every_other'):
        del a[::2]
    with step('empty_cache'):
        torch.cuda.empty_cache()
    with step('realloc'):
        a += [torch.empty(2 ** k + 1000, device=DEV) for k in range(10, 27, 4)]
    return a


@case('expandable', conf='expandable_segments:True')
def case_expandable():
    """Expandable segments grow, shrink (empty_cache unmaps), grow again, end fully unmapped."""
    live = []
    with step('grow'):
        for i in range(1, 13):
            live.append(alloc(i * 5 * MiB + 123))        # 5..60 MiB: the large segment grows
            live.append(alloc(i * 60_000))               # 60..720 KB: the small pool
    with step('shrink'):
        survivors = [live[5], live[14], live[20]]
        live.clear()
        torch.cuda.empty_cache()                         # unmaps the free pages around the survivors
    with step('grow_again'):
        for i in range(1, 9):
            live.append(alloc(i * 10 * MiB + 4097))
            live.append(alloc(i * 100_000 + 17))
    with step('free_all'):
        live.clear()
        survivors.clear()
        torch.cuda.empty_cache()
    expect(last('reserved_bytes.all.current') == 0,
           f'fully unmapped after free_all (reserved_bytes.all.current={last("reserved_bytes.all.current")})')


@case('expandable_maxsplit', conf='expandable_segments:True,max_split_size_mb:64')
def case_expandable_maxsplit():
    """Variable sizes 1..100 MiB plus small ones, random-order frees, empty_cache mid-run."""
    rng = random.Random(5)
    live = []
    for phase in range(4):
        with step(f'phase_{phase}'):
            for i in range(25):
                live.append(alloc(rng.randint(1, 100) * MiB + rng.randint(0, 4095)))
                for _ in range(rng.randint(0, 2)):
                    live.append(alloc(rng.randint(512, 900_000)))
                while len(live) > 20:
                    live.pop(rng.randrange(len(live)))
                if phase == 1 and i == 12:
                    torch.cuda.empty_cache()
    return live                                           # some tensors alive at the dump


@case('streams')
def case_streams():
    """Three side streams: record_stream() frees deferred behind queued work, side-stream allocations."""
    rng = random.Random(6)
    main = torch.cuda.current_stream()
    side = [torch.cuda.Stream() for _ in range(3)]
    mats, keep = [], []
    with step('setup'):
        for s in side:
            with torch.cuda.stream(s):
                mats.append(torch.randn(4096, 4096, device=DEV))    # allocated on the side stream
    for r in range(3):
        with step(f'round_{r}'):
            for i, s in enumerate(side):
                with torch.cuda.stream(s):                         # tens of ms of queued work on s
                    for _ in range(8):
                        busy = mats[i] @ mats[i]                   # allocated and freed on s
                t = torch.randn(rng.randint(1, 16) * MiB // 4, device=DEV)      # on the default stream
                small = torch.randn(rng.randint(1000, 200_000), device=DEV)
                s.wait_stream(main)
                with torch.cuda.stream(s):
                    t.mul_(2)                                      # queued behind the matmuls
                    small.add_(1)
                    keep.append(alloc(rng.randint(1, 4) * MiB + rng.randint(0, 999)))   # directly on s
                t.record_stream(s)
                small.record_stream(s)
                del t, small                                       # free while s is still busy: deferred
            if len(keep) > 4:
                del keep[:2]                                       # side-stream blocks freed from the default stream
    del busy
    return mats, keep


@case('ring_overflow', stacks='python', max_entries=500)
def case_ring_overflow():
    """max_entries=500 over ~3000 allocations: the trace begins mid-run."""
    rng = random.Random(7)
    live, n = [], 0
    for r in range(6):
        with step(f'burst_{r}'):
            for _ in range(500):
                n += 1
                live.append(alloc((n * 37) % 5000 * 1024 + rng.randint(1, 1023)))
                if len(live) > 30:
                    live.pop(rng.randrange(len(live)))
    return live


@case('oom_retry')
def case_oom_retry():
    """A 2 GiB cap: a free-and-retry (num_alloc_retries), then a caught OOM (num_ooms)."""
    cap_memory(2 * GiB)
    rng = random.Random(8)
    with step('fill_cache'):                          # ~1.4 GiB of freed 20..100 MiB segments
        blocks = []
        while sum(b.numel() for b in blocks) < 1400 * MiB:
            blocks.append(alloc(rng.randint(20, 100) * MiB + rng.randint(0, MiB - 1)))
        blocks.clear()
    with step('retry'):                               # fits the cap only once the cache is released
        big = alloc(1 * GiB)
    expect(last('num_alloc_retries') > 0, f'num_alloc_retries={last("num_alloc_retries")} > 0')
    with step('oom'):
        caught = False
        try:
            alloc(3 * GiB)                            # more than the cap
        except torch.cuda.OutOfMemoryError:
            caught = True
    expect(caught and last('num_ooms') > 0, f'OutOfMemoryError caught, num_ooms={last("num_ooms")} > 0')
    with step('after_oom'):                           # and on as usual
        del big
        keep = [alloc(rng.randint(100, 300) * MiB + rng.randint(0, 4095)) for _ in range(4)]
        del keep[1::2]
    return keep


@case('empty_cache_mid')
def case_empty_cache_mid():
    """A small MLP training loop, torch.cuda.empty_cache() inside step 2."""
    with step('init'):
        mlp = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                            nn.Linear(1024, 10)).to(DEV)
        opt = torch.optim.Adam(mlp.parameters(), lr=1e-3)
    for i in range(1, 5):
        with step(f'train_{i}'):
            x = torch.randn(64 * i, 512, device=DEV)
            y = torch.randint(0, 10, (64 * i,), device=DEV)
            F.cross_entropy(mlp(x), y).backward()
            opt.step()
            opt.zero_grad()
            if i == 2:
                torch.cuda.empty_cache()
    return mlp, opt


@case('roundup_gc', conf='roundup_power2_divisions:4,garbage_collection_threshold:0.6')
def case_roundup_gc():
    """A 1.5 GiB cap; reserved goes above 0.6 of it, so cache misses garbage-collect cached blocks."""
    cap_memory(1.5 * GiB)
    rng = random.Random(10)
    live = []
    with step('fill'):                                # ~1 GiB of 8..40 MiB tensors, some small ones
        while sum(t.numel() for t in live) < 1000 * MiB:
            live.append(alloc(rng.randint(8 * MiB, 40 * MiB)))
            live.append(alloc(rng.randint(1000, 500_000)))
    with step('free'):                                # all of it cached
        live.clear()
    with step('bigger'):                              # larger than every cached block: misses, GC
        for _ in range(6):
            live.append(alloc(rng.randint(45 * MiB, 80 * MiB)))
    expect(last('num_device_free') > 0, f'garbage collection freed segments (num_device_free={last("num_device_free")})')
    with step('mixed'):                               # 1 KB..80 MiB
        for _ in range(150):
            if rng.random() < 0.7:
                n = math.exp(rng.uniform(math.log(1000), math.log(4 * MiB)))
            else:
                n = rng.randint(10 * MiB, 80 * MiB)
            live.append(alloc(n))
            if len(live) > 16:
                live.pop(rng.randrange(len(live)))
    say(f'num_alloc_retries={last("num_alloc_retries")} num_device_free={last("num_device_free")}')
    return live


@case('roundup_list', conf='roundup_power2_divisions:[256:1,512:2,1024:4,>:8]')
def case_roundup_list():
    """Per-interval roundup divisions; sizes from 700 B to 2.2 GiB."""
    rng = random.Random(11)
    ladder = [700, 3_000, 100_000, 700_000, 1_500_001, 3_300_000, 13_700_000, 70 * MiB + 1,
              300 * MiB + 3, 600 * MiB + 5, 1300 * MiB + 7, 2200 * MiB + 9]
    with step('ladder'):
        live = [alloc(n) for n in ladder]
    with step('free_ladder'):
        live.clear()
    for r in range(3):
        with step(f'random_{r}'):
            for _ in range(40):
                live.append(alloc(math.exp(rng.uniform(math.log(1024), math.log(1.5 * GiB)))))
                if len(live) > 12:
                    live.pop(rng.randrange(len(live)))
    return live


@case('cuda_graph')
def case_cuda_graph():
    """Forward+backward captured into a CUDA graph (a private pool), replayed, then released."""
    with step('init'):
        mlp = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                            nn.Linear(512, 10)).to(DEV)
        opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
        static_x = torch.randn(64, 256, device=DEV)
        static_y = torch.randint(0, 10, (64,), device=DEV)
    with step('warmup'):                              # on a side stream, as the CUDA graphs docs do
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(mlp(static_x), static_y).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(s)
    with step('capture'):
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)               # so backward allocates .grad from the graph's pool
        with torch.cuda.graph(g):
            static_loss = F.cross_entropy(mlp(static_x), static_y)
            static_loss.backward()
    for i in range(3):
        with step(f'replay_{i}'):
            static_x.copy_(torch.randn(64, 256, device=DEV))
            static_y.copy_(torch.randint(0, 10, (64,), device=DEV))
            g.replay()
            opt.step()
    with step('release'):
        del g, static_loss, static_x, static_y
        opt.zero_grad(set_to_none=True)               # the grads live in the graph's pool
        if hasattr(torch._C, '_cuda_clearCublasWorkspaces'):
            torch._C._cuda_clearCublasWorkspaces()    # a workspace made during capture would pin the pool
        torch.cuda.empty_cache()
    return mlp, opt


@case('varlen_transformer', context='all', stacks='python')
def case_varlen_transformer():
    """A small TransformerEncoder + Linear head, AdamW, six sequence lengths."""
    with step('init'):
        layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, batch_first=True)
        encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).to(DEV)
        head = nn.Linear(128, 16).to(DEV)
        opt = torch.optim.AdamW(list(encoder.parameters()) + list(head.parameters()), lr=1e-3)
    for i, seq in enumerate([37, 128, 64, 200, 17, 150]):
        with step(f'train_{i}_seq{seq}'):
            x = torch.randn(8, seq, 128, device=DEV)
            y = torch.randint(0, 16, (8, seq), device=DEV)
            F.cross_entropy(head(encoder(x)).flatten(0, 1), y.flatten()).backward()
            opt.step()
            opt.zero_grad()
    return encoder, head, opt


# --- long runs: traces shaped like users' (tens of thousands of events, many keyframes) ---

LONG_STEPS = 300


def long_training(seed, steps=LONG_STEPS, side_stream_every=7, empty_cache_every=100):
    """A TransformerEncoder trained for `steps` steps on varying sequence lengths: about
    200 trace entries a step. Every `side_stream_every` steps a batch is prepared on a
    side stream and handed over with record_stream; every `empty_cache_every` steps the
    cache is emptied mid-run."""
    rng = random.Random(seed)
    with step('init'):
        layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, batch_first=True)
        encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).to(DEV)
        head = nn.Linear(128, 16).to(DEV)
        opt = torch.optim.AdamW(list(encoder.parameters()) + list(head.parameters()), lr=1e-3)
    side = torch.cuda.Stream()
    for i in range(steps):
        seq = rng.choice([17, 37, 64, 100, 128, 150, 200, 256])
        with step(f'train_{i}_seq{seq}'):
            if i % side_stream_every == 0:
                with torch.cuda.stream(side):
                    x = torch.randn(8, seq, 128, device=DEV)
                torch.cuda.current_stream().wait_stream(side)
                x.record_stream(torch.cuda.current_stream())
            else:
                x = torch.randn(8, seq, 128, device=DEV)
            y = torch.randint(0, 16, (8, seq), device=DEV)
            F.cross_entropy(head(encoder(x)).flatten(0, 1), y.flatten()).backward()
            opt.step()
            opt.zero_grad()
            del x, y
            if empty_cache_every and i % empty_cache_every == empty_cache_every - 1:
                torch.cuda.empty_cache()
    return encoder, head, opt


@case('long_train', max_entries=1_000_000)
def case_long_train():
    """300 training steps, every event kept (tens of thousands of trace entries)."""
    return long_training(21)


@case('long_ring_overflow', max_entries=20_000)
def case_long_ring_overflow():
    """The same run with a 20,000-entry ring: the trace begins mid-run, after many steps."""
    return long_training(22)


@case('long_expandable', conf='expandable_segments:True', max_entries=1_000_000)
def case_long_expandable():
    """The long run under expandable segments."""
    return long_training(23)


@case('long_rank0', max_entries=1_000_000)
def case_long_rank0():
    """One of two processes of one job on one GPU (long_rank1 is the other), for ranks."""
    return long_training(24)


@case('long_rank1', max_entries=1_000_000)
def case_long_rank1():
    """The second process: the same model, another data order and a longer run."""
    return long_training(25, steps=LONG_STEPS + 40)


# ===== MISSING FROM THE CORPUS: needs two GPUs; only single-GPU machines were available =====
@case('two_devices', devices=2)
def case_two_devices():
    """Both devices allocate, one step each; skipped when torch.cuda.device_count() < 2."""
    if torch.cuda.device_count() < 2:
        raise SkipCase(f'needs 2 GPUs, this machine has {torch.cuda.device_count()}: '
                       'two_devices is missing from the corpus')
    rng = random.Random(12)
    keep = {}
    for d in (0, 1):
        dev = f'cuda:{d}'
        with torch.cuda.device(d), step(f'device_{d}', device=d):
            a = torch.randn(1024, 1024, device=dev)
            keep[d] = [a @ a] + [alloc(rng.randint(1000, 30 * MiB), device=dev) for _ in range(12)]
            del keep[d][3::3]
    return keep
# =============================================================================================


# --- running ----------------------------------------------------------------------------

def child_env(conf):
    """This process's environment with exactly the case's allocator settings."""
    env = {k: v for k, v in os.environ.items() if k not in CONF_VARS}
    if conf:
        env['PYTORCH_CUDA_ALLOC_CONF'] = conf
    env['PYTHONUNBUFFERED'] = '1'
    return env


def child_main(name, outdir):
    global torch, nn, F
    spec = CASES[name]
    want = child_env(spec['conf'])
    if any(os.environ.get(k) != want.get(k) for k in CONF_VARS):
        # Run directly with other settings: start again with the case's (before CUDA exists).
        os.execve(sys.executable, [sys.executable, SCRIPT, '--case', name, outdir], want)
    import torch as torch_
    import torch.nn as nn_
    import torch.nn.functional as F_
    import torch.profiler  # noqa: F401  (record_function)
    torch, nn, F = torch_, nn_, F_

    gc.disable()                 # garbage is collected at step entries only
    torch.manual_seed(SEED)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    os.makedirs(outdir, exist_ok=True)
    h = spec['history']
    torch.cuda.memory._record_memory_history(enabled='all', context=h['context'], stacks=h['stacks'],
                                             max_entries=h['max_entries'])
    try:
        alive = spec['fn']()
    except SkipCase as e:
        say(f'skipped: {e}')
        sys.exit(SKIP_RC)
    path = dump(name, spec, outdir)
    del alive                    # what the case kept alive for the dump
    check_pickle(path, spec['conf'])
    if PROBLEMS:
        sys.exit(f'{name}: check failed: ' + '; '.join(PROBLEMS))


def parent_main(outdir, names):
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f'unknown case(s): {", ".join(unknown)}; cases: {", ".join(CASES)}')
    os.makedirs(outdir, exist_ok=True)
    failed, skipped = [], []
    for name in names or list(CASES):
        pickle_path = os.path.join(outdir, name + '.pickle')
        for stale in (pickle_path, os.path.join(outdir, name + '.stats.json')):
            if os.path.exists(stale):
                os.remove(stale)
        start = time.monotonic()
        try:
            r = subprocess.run([sys.executable, SCRIPT, '--case', name, outdir], env=child_env(CASES[name]['conf']),
                               capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
            rc, out, err = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = None, e.stdout or '', f'timed out after {CASE_TIMEOUT_S} s'
            out = out.decode(errors='replace') if isinstance(out, bytes) else out
        secs = time.monotonic() - start
        notes = [line for line in out.splitlines() if line.strip()]
        err_lines = [line for line in err.splitlines() if line.strip()]
        if rc == 0 and os.path.exists(pickle_path):
            size = os.path.getsize(pickle_path)
            flag = f'  (over the {SIZE_TARGET // 1000} KB target)' if size > SIZE_TARGET else ''
            say(f'{name:22s} {size:9d} bytes {secs:7.1f} s{flag}')
        elif rc == SKIP_RC:
            skipped.append(name)
            say(f'{name:22s} skipped {secs:7.1f} s: {notes[-1].removeprefix("skipped: ") if notes else ""}')
            notes = notes[:-1]
        else:
            failed.append(name)
            reason = err_lines[-1] if err_lines else f'exit status {rc}'
            say(f'{name:22s} FAILED  {secs:7.1f} s: {reason}')
        for line in notes:
            say('    ' + line)
        if name in failed:
            for line in err_lines[-15:-1]:
                say('    | ' + line)
    say(f'{len(names or CASES) - len(failed) - len(skipped)} made, {len(skipped)} skipped, {len(failed)} failed'
        + (f': {", ".join(failed)}' if failed else ''))
    sys.exit(1 if failed else 0)


def main(argv):
    if len(argv) == 2 and argv[1] == '--list':
        say('\n'.join(CASES))
    elif len(argv) == 4 and argv[1] == '--case' and argv[2] in CASES:
        child_main(argv[2], argv[3])
    elif len(argv) >= 2 and not argv[1].startswith('-'):
        parent_main(argv[1], argv[2:])
    else:
        sys.exit(f'usage: {argv[0]} OUTDIR [CASE ...] | --list | --case NAME OUTDIR\ncases: {", ".join(CASES)}')


if __name__ == '__main__':
    main(sys.argv)
