#!/usr/bin/env bash
# Session 13 on the H200, sixth call: the pickle rows again with the session's
# last code (3f044a3, build-h200/final: the per-segment pass with its caps on
# segments), beside fb2cee8 (build-h200/before), rounds alternating.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
echo "== machine"; date -u; nproc
mkdir -p /tmp/big && python3 testdata/pytorch/make_snapshots.py /tmp/big big 1000000 > /dev/null 2>&1; ls -l /tmp/big/big.pickle
for r in 1 2 3; do for v in before final; do build-h200/$v/bench_pickle_phases /tmp/big/big.pickle 16 | grep read | sed "s/^/$v: /"; done; done
python3 - <<'PY'
import pickle, subprocess, time
p = '/tmp/big/big.pickle'
best_load = min((lambda t: (pickle.load(open(p, 'rb')), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(3))
def timed(cmd):
    t = time.perf_counter(); subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL); return time.perf_counter() - t
for r in (1, 2, 3, 4):
    for v in ('before', 'final'):
        ours = min(timed(['build-h200/' + v + '/cachealloc-analyze', 'summary', p]) for _ in range(3))
        print(f"round {r} {v}: pickle.load {best_load:.2f} s; summary {ours:.3f} s (ratio {ours / best_load:.3f})")
PY
for v in before final; do build-h200/$v/cachealloc-analyze summary /tmp/big/big.pickle --format json | md5sum; done
echo "== done"; date -u
