#!/usr/bin/env bash
# Session 12 on the H200, second call: the parallel analysis after its
# readers share the file's head (947bfae + bench_pickle_phases), on 3M and
# 20M events, on 1, 4, 8, 12 and 16 threads; where a PyTorch pickle's
# summary time goes (bench_pickle_phases) and its ratio to pickle.load;
# conformance on the cuda device 4 times, each capped sequence's free
# memory at its first mismatch printed (cachealloc-conformance's note).
# Release binaries built on the dev VM (build-h200/rel), the library they
# need in build-h200/syslib.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
B=build-h200/rel
echo "== machine"; date -u; nproc; lscpu | grep -E "Model name|Thread\(s\) per core"
echo "== 3M events"
$B/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o /tmp/s3m.bin
taskset -c 4 $B/bench_analyze_throughput /tmp/s3m.bin 0 1
for r in 1 2; do $B/bench_analyze_throughput /tmp/s3m.bin 4 16; done
for t in 4 8 12; do $B/bench_analyze_throughput /tmp/s3m.bin 4 $t | grep "in ranges"; done
echo "== 20M events"
$B/cachealloc-synthetic --events 20000000 --seed 2 --stacks native --threads 1 -o /tmp/s20m.bin
for r in 1 2; do $B/bench_analyze_throughput /tmp/s20m.bin 4 16; done
for t in 4 8 12; do $B/bench_analyze_throughput /tmp/s20m.bin 4 $t | grep "in ranges"; done
for t in 1 16 1 16; do /usr/bin/time -f "cachealloc-analyze summary --analysis-threads $t: %e s, %M KiB" \
  $B/cachealloc-analyze summary /tmp/s20m.bin --analysis-threads $t > /dev/null; done
echo "== a 3M-entry PyTorch pickle: where summary's time goes, and the ratio to pickle.load"
mkdir -p /tmp/big && (time python3 testdata/pytorch/make_snapshots.py /tmp/big big 1000000) 2>&1 | tail -3
for r in 1 2; do $B/bench_pickle_phases /tmp/big/big.pickle 16; done
python3 - <<'PY'
import pickle, subprocess, time
p = '/tmp/big/big.pickle'
best_load = min((lambda t: (pickle.load(open(p, 'rb')), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(2))
def timed(cmd):
    t = time.perf_counter(); subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL); return time.perf_counter() - t
b = 'build-h200/rel/cachealloc-analyze'
for r in (1, 2):
    for threads in ('1', '0'):
        ours = min(timed([b, 'summary', p, '--analysis-threads', threads]) for _ in range(3))
        print(f"round {r}, --analysis-threads {threads}: pickle.load {best_load:.2f} s; summary {ours:.3f} s (ratio {ours / best_load:.3f})")
PY
echo "== conformance on the cuda device, 4 runs"
for r in 1 2 3 4; do
  $B/cachealloc-conformance --device cuda testdata/conformance/*.csv > /tmp/conf$r.txt 2>&1
  echo "cuda run $r: $(grep -cE " ([0-9]+)/\1 rows match$" /tmp/conf$r.txt) of $(ls testdata/conformance/*.csv | wc -l) match"
  grep -E "first mismatch|note:|expected|actual" /tmp/conf$r.txt | cut -c1-300
done
$B/cachealloc-conformance testdata/conformance/*.csv 2>&1 | grep -cE " ([0-9]+)/\1 rows match$"
echo "== done"; date -u
