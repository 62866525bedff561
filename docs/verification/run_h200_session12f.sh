#!/usr/bin/env bash
# Session 12 on the H200, fifth call: the parallel analysis after d049a94 (a range's effect keeps
# about the live blocks), on 3M and 20M events, 16 and 8 threads; then where the 3M-entry PyTorch
# pickle's summary spends its time, phase by phase, from a build of 3277e3d with temporary timing
# probes (cachealloc-analyze-phases, CA_PHASES=1; the probes were not committed).
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
B=build-h200/rel
echo "== machine"; date -u; nproc
$B/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o /tmp/s3m.bin
$B/cachealloc-synthetic --events 20000000 --seed 2 --stacks native --threads 1 -o /tmp/s20m.bin
for f in /tmp/s3m.bin /tmp/s20m.bin; do
  for r in 1 2 3; do $B/bench_analyze_throughput $f 4 16 | grep -E "file:|one core|in ranges"; done
  $B/bench_analyze_throughput $f 4 8 | grep "in ranges"
done
mkdir -p /tmp/big && python3 testdata/pytorch/make_snapshots.py /tmp/big big 1000000 > /dev/null 2>&1
ls -l /tmp/big/big.pickle
for r in 1 2 3; do echo "-- phases, round $r"; /usr/bin/time -f "wall %e s user %U sys %S rss %M KiB" env CA_PHASES=1 $B/cachealloc-analyze-phases summary /tmp/big/big.pickle 2>&1 >/dev/null; done
echo "-- phases, one analysis thread"; CA_PHASES=1 $B/cachealloc-analyze-phases summary /tmp/big/big.pickle --analysis-threads 1 2>&1 >/dev/null
cat /sys/kernel/mm/transparent_hugepage/enabled
python3 - <<'PY'
import pickle, subprocess, time
p = '/tmp/big/big.pickle'
best_load = min((lambda t: (pickle.load(open(p, 'rb')), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(2))
def timed(cmd):
    t = time.perf_counter(); subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL); return time.perf_counter() - t
ours = min(timed(['build-h200/rel/cachealloc-analyze', 'summary', p]) for _ in range(3))
print(f"pickle.load {best_load:.2f} s; summary {ours:.3f} s (ratio {ours / best_load:.3f})")
PY
echo "== done"; date -u
