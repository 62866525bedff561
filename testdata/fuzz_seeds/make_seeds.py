#!/usr/bin/env python3
"""Writes the small fuzzing seeds of testdata/fuzz_seeds/ (fuzz/run_fuzzer.sh
adds every other input of testdata/ and analyzer/testdata/ up to the target's
max_len: the format versions, the hostile files, the small recordings).

- pytorch_NAME.pickle: each real PyTorch pickle of testdata/pytorch/ cut to
  what PyTorch itself writes with a small ring (the last N trace entries, as
  torch.cuda.memory._record_memory_history(max_entries=N) keeps) and shallow
  stacks, re-pickled with protocol 4 as _dump_snapshot does: the first of
  (N, frames) = (6, 2), (4, 1), (3, 0) that is at most 4096 bytes (the
  targets' max_len, fuzz/*.options), none when even that is larger.
- ours_vN.pickle: testdata/format_versions/vN.bin converted by our own
  writer (cachealloc-analyze convert), when the analyzer is given.
Run from the repository root:
    python3 testdata/fuzz_seeds/make_seeds.py [path/to/cachealloc-analyze]"""
import glob
import os
import pickle
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, '..', '..')
MAX_LEN = 4096


def shrink(snapshot, entries, frames):
    small = dict(snapshot)
    small['device_traces'] = [[dict(e, frames=list(e.get('frames', []))[:frames]) for e in trace[-entries:]]
                              for trace in snapshot['device_traces']]
    small['segments'] = [dict(s, blocks=[dict(b, frames=list(b.get('frames', []))[:frames]) for b in s['blocks']])
                         for s in snapshot['segments']]
    return pickle.dumps(small, protocol=4)


for path in sorted(glob.glob(os.path.join(ROOT, 'testdata', 'pytorch', '**', '*.pickle'), recursive=True)):
    with open(path, 'rb') as f:
        snapshot = pickle.load(f)
    if not isinstance(snapshot, dict):
        continue  # segments_only/: small already, taken as it is
    rel = os.path.relpath(path, os.path.join(ROOT, 'testdata', 'pytorch')).replace(os.sep, '_')
    out = os.path.join(HERE, 'pytorch_' + rel)
    if os.path.exists(out):
        os.remove(out)
    for entries, frames in ((6, 2), (4, 1), (3, 0)):
        data = shrink(snapshot, entries, frames)
        if len(data) <= MAX_LEN:
            with open(out, 'wb') as f:
                f.write(data)
            break

if len(sys.argv) > 1:
    for path in sorted(glob.glob(os.path.join(ROOT, 'testdata', 'format_versions', 'v*.bin'))):
        name = os.path.splitext(os.path.basename(path))[0]
        subprocess.run([sys.argv[1], 'convert', path, '-o', os.path.join(HERE, f'ours_{name}.pickle'), '-f'],
                       check=True, stderr=subprocess.DEVNULL)
