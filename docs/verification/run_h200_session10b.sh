#!/usr/bin/env bash
# Session 10 on the H200, second script: every suite on the cuda backend with
# the command-line programs beside them (the first script's call lacked
# them: six suites that run cachealloc-analyze failed on that alone), every
# conformance sequence, and the analyzer and pickle figures, before (3bc6786)
# against after (4091331, with the session's analyzer and pickle commits).
# Suites: build-h200/suites10b.txz holds bin/tests/test_* (RelWithDebInfo,
# debug info stripped but test_history_events') and bin/cachealloc-*, built in
# /tmp/wt10-after; the tree is copied there so their compiled-in paths hold.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
B=build-h200/after
A=build-h200/before
echo "== machine"; date -u; nproc; lscpu | grep -E "Model name"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'
mkdir -p /tmp/wt10-after && cp -a . /tmp/wt10-after/ && mkdir -p /tmp/wt10-after/build && tar xJf build-h200/suites10b.txz -C /tmp/wt10-after/build
S=/tmp/wt10-after/build/bin
echo "== every suite on the cuda backend"
for t in $S/tests/test_*; do
  r=$(cd /tmp/wt10-after && CACHEALLOC_TEST_DEVICE=cuda timeout 240 $t 2>&1 | grep -E "test cases:|Status"); echo "$(basename $t): $r"
done
echo "== conformance: every sequence, cuda device, then simulated"
$B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | grep -c "rows match"
$B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | grep -v "rows match" | tail -8
$B/cachealloc-conformance testdata/conformance/*.csv 2>&1 | grep -c "rows match"
echo "== analyzer on one core and with decode threads, 3M events: before, after (2 rounds)"
$B/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o /tmp/s3m.bin
ls -l /tmp/s3m.bin
for r in 1 2; do
  taskset -c 4 $A/bench_analyze_throughput /tmp/s3m.bin 0
  taskset -c 4 $B/bench_analyze_throughput /tmp/s3m.bin 0
done
echo "-- all cores (decode threads by default): before, after"
$A/bench_analyze_throughput /tmp/s3m.bin; $B/bench_analyze_throughput /tmp/s3m.bin
echo "== a 3M-entry PyTorch pickle: summary against pickle.load, before and after"
mkdir -p /tmp/big && (time python3 testdata/pytorch/make_snapshots.py /tmp/big big 1000000) 2>&1 | tail -3
python3 - <<'PY'
import pickle, subprocess, time
p = '/tmp/big/big.pickle'
best_load = min((lambda t: (pickle.load(open(p, 'rb')), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(2))
d = pickle.load(open(p, 'rb')); n = sum(len(tr) for tr in d['device_traces']); del d
def timed(cmd):
    t = time.perf_counter(); subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL); return time.perf_counter() - t
for r in (1, 2):
    for label, b in (('before', 'build-h200/before'), ('after', 'build-h200/after')):
        ours = min(timed([b + '/cachealloc-analyze', 'summary', p]) for _ in range(3))
        one = min(timed(['taskset', '-c', '4', b + '/cachealloc-analyze', 'summary', p]) for _ in range(2))
        print(f"round {r} {label}: {n} trace entries; pickle.load {best_load:.2f} s; summary {ours:.3f} s (ratio {ours / best_load:.3f}), "
              f"one core {one:.3f} s (ratio {one / best_load:.3f})")
PY
echo "== done"; date -u
