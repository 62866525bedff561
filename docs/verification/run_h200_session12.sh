#!/usr/bin/env bash
# Session 12 on the H200 (docs/PERFORMANCE.md, "The analyzer in parallel
# ranges on the H200, session 12"): the whole-trace analysis on 1 to 16
# threads (AnalysisOptions::threads), the serial pass of the same binary
# beside it, on our 3M- and 20M-event files and on a 3M-entry PyTorch
# pickle against Python's pickle.load; then every suite on the cuda backend
# (SUITES, an xz tar of the RelWithDebInfo test binaries and CLI programs of
# the same commit) and conformance on both devices, three times on cuda,
# with the free memory each capped sequence found after its hold.
# Release binaries built on the dev VM (build-h200/rel) with the library
# they need (build-h200/syslib).
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
B=build-h200/rel
echo "== machine"; date -u; nproc; lscpu | grep -E "Model name|Thread\(s\) per core|^L2|^L3"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== 3M events: one core pinned (serial), then all cores: decode threads (4), ranges on 16 and 8 threads"
$B/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o /tmp/s3m.bin
ls -l /tmp/s3m.bin
taskset -c 4 $B/bench_analyze_throughput /tmp/s3m.bin 0 1
for r in 1 2; do $B/bench_analyze_throughput /tmp/s3m.bin 4 16; done
$B/bench_analyze_throughput /tmp/s3m.bin 4 8
echo "== 20M events: ranges on 16 threads (2 rounds), the command line on 1 and 16"
$B/cachealloc-synthetic --events 20000000 --seed 2 --stacks native --threads 1 -o /tmp/s20m.bin
ls -l /tmp/s20m.bin
for r in 1 2; do $B/bench_analyze_throughput /tmp/s20m.bin 4 16; done
for t in 1 16 1 16; do /usr/bin/time -f "cachealloc-analyze summary --analysis-threads $t: %e s, %M KiB" \
  $B/cachealloc-analyze summary /tmp/s20m.bin --analysis-threads $t > /dev/null; done
echo "== a 3M-entry PyTorch pickle: summary against pickle.load, serial and parallel analysis"
mkdir -p /tmp/big && (time python3 testdata/pytorch/make_snapshots.py /tmp/big big 1000000) 2>&1 | tail -3
python3 - <<'PY'
import pickle, subprocess, time
p = '/tmp/big/big.pickle'
best_load = min((lambda t: (pickle.load(open(p, 'rb')), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(2))
d = pickle.load(open(p, 'rb')); n = sum(len(tr) for tr in d['device_traces']); del d
def timed(cmd):
    t = time.perf_counter(); subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL); return time.perf_counter() - t
b = 'build-h200/rel/cachealloc-analyze'
for r in (1, 2):
    for threads in ('1', '0'):
        ours = min(timed([b, 'summary', p, '--analysis-threads', threads]) for _ in range(3))
        print(f"round {r}, --analysis-threads {threads}: {n} trace entries; pickle.load {best_load:.2f} s; "
              f"summary {ours:.3f} s (ratio {ours / best_load:.3f})")
PY
if [ -n "${SUITES:-}" ]; then
  SRC=${CACHEALLOC_SOURCE:-/work/main}
  [ -e "$SRC" ] || { mkdir -p "$(dirname "$SRC")" && cp -a . "$SRC"; }
  mkdir -p "$SRC/build" && tar -C "$SRC/build" -xJf "$SUITES"
  echo "== every suite on the cuda backend"
  for t in $SRC/build/bin/tests/test_*; do
    case $(basename $t) in test_install_consumer|test_browser_report) continue ;; esac
    r=$(cd $SRC && CACHEALLOC_TEST_DEVICE=cuda timeout 240 $t 2>&1 | grep -E "test cases:|Status" | tr '\n' ' '); echo "$(basename $t): $r"
  done
  echo "== conformance: every sequence, cuda device 3 times, then simulated"
  C=$SRC/build/bin/cachealloc-conformance
  for r in 1 2 3; do
    # a passing sequence prints "N/N rows match"; a failing one "M/N rows match; first mismatch ..."
    $C --device cuda testdata/conformance/*.csv > /tmp/conf$r.txt 2>&1
    echo "cuda run $r: $(grep -cE " ([0-9]+)/\1 rows match$" /tmp/conf$r.txt) of $(ls testdata/conformance/*.csv | wc -l) match"
    grep -E "first mismatch|note:" /tmp/conf$r.txt | cut -c1-400
  done
  $C testdata/conformance/*.csv 2>&1 | grep -cE " ([0-9]+)/\1 rows match$"
fi
echo "== done"; date -u
