#!/usr/bin/env bash
# Session 8 on the H200 (docs/PERFORMANCE.md, "Issue 19's table on the H200,
# session 8"): every suite on the cuda backend and every conformance sequence
# on both devices after this session's allocator and recorder changes, then
# every figure of issue 19's table, before (build-h200-before: e4cd759, the
# end of session 7) and after (build-h200), PyTorch beside them in this one
# run. Binaries built Release on the dev VM from clean worktrees; test
# binaries name their sources by $CACHEALLOC_SOURCE.
#   PART=suites|table|all (default all)
#   SUITES_BIN: where the test binaries are (default build-h200/bin); session 8
#   ran them from the clean-clone CI build (build/bin, RelWithDebInfo,
#   stripped of debug info), with CACHEALLOC_SOURCE=/tmp/ci-clone8.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
SRC=${CACHEALLOC_SOURCE:-/work/main}
[ -e "$SRC" ] || { mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC"; }
PART=${PART:-all}
B=build-h200/bin
A=build-h200-before/bin
SB=${SUITES_BIN:-$B}
T=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
echo "== machine"; date -u; nproc; lscpu | grep -E "Model name|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'
if [ "$PART" != table ]; then
  echo "== every suite on the cuda backend"
  for t in $SB/tests/test_*; do
    case $(basename $t) in test_install_consumer|test_browser_report) continue ;; esac
    r=$(CACHEALLOC_TEST_DEVICE=cuda timeout 240 $t 2>&1 | grep -E "test cases:|Status"); echo "$(basename $t): $r"
  done
  echo "== conformance: every sequence, cuda device"
  $B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | grep -c "rows match"
  $B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | grep -v "rows match" | tail -8
  echo "== conformance: every sequence, simulated device"
  $B/cachealloc-conformance testdata/conformance/*.csv 2>&1 | grep -c "rows match"
  $B/cachealloc-conformance testdata/conformance/*.csv 2>&1 | grep -v "rows match" | tail -8
fi
[ "$PART" = suites ] && { echo "== done"; date -u; exit 0; }
echo "== PyTorch's allocator built here"
g++ -O2 -std=c++17 bench/torch_peer.cpp -Ibench -I$T/include -L$T/lib -lc10_cuda -lc10 -I/usr/local/cuda/include \
    -L/usr/local/cuda/lib64 -lcudart -ldl -Wl,-rpath,$T/lib -o /tmp/torch_peer 2>&1 | tail -3
echo "== 1. cached 4 KiB pair, one thread: before, after, PyTorch (3 rounds)"
for r in 1 2 3; do
  CACHEALLOC_DEVICE=cuda $A/bench_threads 1 500000 off; CACHEALLOC_DEVICE=cuda $B/bench_threads 1 500000 off
  /tmp/torch_peer 1 500000
done
echo "== 2. mixed workload, 256 slots, 512 B-8 MiB, one thread: before, after, PyTorch (2 rounds)"
for r in 1 2; do
  CACHEALLOC_DEVICE=cuda $A/bench_mixed 1000000 3 off; CACHEALLOC_DEVICE=cuda $B/bench_mixed 1000000 3 off
  /tmp/torch_peer --mixed 1000000 3
done
echo "== 3. threads: glibc control, before, after, PyTorch (2 rounds at 1, 8, 16)"
for r in 1 2; do
  for n in 1 8 16; do
    CACHEALLOC_DEVICE=cuda $B/bench_threads $n 200000 malloc
    CACHEALLOC_DEVICE=cuda $A/bench_threads $n 200000 off
    CACHEALLOC_DEVICE=cuda $B/bench_threads $n 200000 off
    /tmp/torch_peer $n 200000
  done
done
echo "== 4-5. history on, no stacks and native stacks, against off, one thread: before, after; PyTorch from Python"
for r in 1 2; do taskset -c 2 $A/bench_history_overhead 500000 9; taskset -c 2 $B/bench_history_overhead 500000 9; done
python3 bench/torch_history.py
echo "== 6. 16 threads with history: before, after"
for h in off none native; do
  CACHEALLOC_DEVICE=cuda $A/bench_threads 16 200000 $h; CACHEALLOC_DEVICE=cuda $B/bench_threads 16 200000 $h
done
echo "== 7-8. analyzer on one core and on all, 3M events: before (its format), after (its format)"
$A/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o /tmp/s3m-before.bin
$B/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o /tmp/s3m.bin
ls -l /tmp/s3m-before.bin /tmp/s3m.bin
$B/bench_analyze_throughput --rewrite 5 /tmp/s3m.bin /tmp/s3m_v5.bin
for r in 1 2; do
  echo "-- round $r: before on its file, after on version 6, after on the same events as version 5"
  taskset -c 4-7 $A/bench_analyze_throughput /tmp/s3m-before.bin
  taskset -c 4-7 $B/bench_analyze_throughput /tmp/s3m.bin
  taskset -c 4-7 $B/bench_analyze_throughput /tmp/s3m_v5.bin
done
echo "-- all cores (decode threads by default), after, version 6"
$B/bench_analyze_throughput /tmp/s3m.bin
echo "== 9. a 3M-entry PyTorch pickle: summary against pickle.load, before and after, and _memory_viz stats"
mkdir -p /tmp/big && (time python3 testdata/pytorch/make_snapshots.py /tmp/big big 1000000) 2>&1 | tail -3
python3 - <<'PY'
import pickle, subprocess, time
p = '/tmp/big/big.pickle'
best_load = min((lambda t: (pickle.load(open(p, 'rb')), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(2))
d = pickle.load(open(p, 'rb')); n = sum(len(tr) for tr in d['device_traces']); del d
def timed(cmd):
    t = time.perf_counter(); subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL); return time.perf_counter() - t
for label, b in (('before', 'build-h200-before/bin'), ('after', 'build-h200/bin')):
    ours = min(timed([b + '/cachealloc-analyze', 'summary', p]) for _ in range(3))
    one = min(timed([b + '/cachealloc-analyze', 'summary', p, '--decode-threads', '0']) for _ in range(2))
    print(f"{label}: {n} trace entries; pickle.load {best_load:.2f} s; summary {ours:.3f} s (ratio {ours / best_load:.3f}), "
          f"--decode-threads 0 {one:.2f} s")
viz = timed(['python3', '-m', 'torch.cuda._memory_viz', 'stats', p])
print(f"_memory_viz stats {viz:.2f} s")
PY
echo "== 10. dump: 1M events, 10k distinct stacks: before, after, PyTorch"
CACHEALLOC_DEVICE=cuda $A/bench_dump_time 1000000 10000
CACHEALLOC_DEVICE=cuda $B/bench_dump_time 1000000 10000
python3 bench/torch_dump_time.py 1000000 10000 120
# perf is not installed on the H200 host: Debian 12's, with its libraries, is
# carried in build-h200/perf.
if [ -x build-h200/perf/perf ]; then
  perf() { LD_LIBRARY_PATH=$PWD/build-h200/perf:$LD_LIBRARY_PATH "$PWD/build-h200/perf/perf" "$@"; }
  echo "== 11. perf on the H200: cached pair (1 thread), 16 threads, 16 threads with native stacks"
  perf --version
  CACHEALLOC_DEVICE=cuda perf stat -e cycles,instructions,cache-misses,LLC-load-misses $B/bench_threads 1 2000000 off 2>&1 | tail -12
  for spec in "1 2000000 off" "16 200000 off" "16 200000 native"; do
    echo "-- perf record: bench_threads $spec"
    CACHEALLOC_DEVICE=cuda perf record -q -g -o /tmp/perf.data $B/bench_threads $spec 2>&1 | tail -3
    perf report -i /tmp/perf.data --no-children --stdio 2>/dev/null | grep -v "^#" | grep -E "^ +[0-9.]+%" | head -25
  done
  echo "-- perf record: bench_analyze_throughput, one core"
  perf record -q -g -o /tmp/perf.data taskset -c 4 $B/bench_analyze_throughput /tmp/s3m.bin 0 2>&1 | tail -3
  perf report -i /tmp/perf.data --no-children --stdio 2>/dev/null | grep -v "^#" | grep -E "^ +[0-9.]+%" | head -25
else
  echo "perf: not installed on this host"
fi
echo "== done"; date -u
