#!/usr/bin/env bash
# Session 6 on the H200 (docs/VERIFICATION.md, docs/PERFORMANCE.md): every
# suite on the cuda backend and every conformance sequence on both devices
# after the recorder's clock change (commit 1f5e881), then issue 19's table,
# ours and PyTorch's allocator side by side in this one run, with the dump
# timing. Binaries built Release on the dev VM from a clean worktree of HEAD
# at $CACHEALLOC_SOURCE (test binaries name their sources by that path).
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
SRC=${CACHEALLOC_SOURCE:-/work/main}
[ -e "$SRC" ] || { mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC"; }
B=build-h200/bin
T=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
echo "== machine"; date -u; nproc; lscpu | grep -E "Model name" | head -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'
if [ "${SKIP_SUITES:-0}" != 1 ]; then
  echo "== every suite on the cuda backend"
  for t in $B/tests/test_*; do
    case $(basename $t) in test_install_consumer|test_browser_report) continue ;; esac
    r=$(CACHEALLOC_TEST_DEVICE=cuda timeout 240 $t 2>&1 | grep -E "test cases:|Status"); echo "$(basename $t): $r"
  done
  echo "== test_history_stress, normal size, 3 runs (0 replay anomalies required)"
  for i in 1 2 3; do CACHEALLOC_TEST_DEVICE=cuda $B/tests/test_history_stress 2>&1 | grep -E "MESSAGE|Status|ERROR|values"; done
  echo "== conformance: every sequence, cuda device"
  $B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | grep -c "rows match"
  $B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | grep -v "rows match" | tail -5
  echo "== conformance: every sequence, simulated device"
  $B/cachealloc-conformance testdata/conformance/*.csv 2>&1 | grep -c "rows match"
  $B/cachealloc-conformance testdata/conformance/*.csv 2>&1 | grep -v "rows match" | tail -5
fi
echo "== issue 19 table: PyTorch's allocator built here"
g++ -O2 -std=c++17 bench/torch_peer.cpp -Ibench -I$T/include -L$T/lib -lc10_cuda -lc10 -I/usr/local/cuda/include \
    -L/usr/local/cuda/lib64 -lcudart -ldl -Wl,-rpath,$T/lib -o /tmp/torch_peer 2>&1 | tail -3
echo "== 1. cached 4 KiB pair, one thread (3 rounds each, interleaved)"
for r in 1 2 3; do CACHEALLOC_DEVICE=cuda $B/bench_threads 1 500000 off; /tmp/torch_peer 1 500000; done
echo "== 2. mixed workload, 256 slots, 512 B-8 MiB, one thread"
for r in 1 2; do CACHEALLOC_DEVICE=cuda $B/bench_mixed 1000000 3 off; /tmp/torch_peer --mixed 1000000 3; done
echo "== 3. 16 threads, each on its own stream"
for r in 1 2; do for n in 1 16; do CACHEALLOC_DEVICE=cuda $B/bench_threads $n 200000 off; /tmp/torch_peer $n 200000; done; done
echo "== 4-5. history on, no stacks and native stacks, vs off (one thread); PyTorch's from Python"
taskset -c 2 $B/bench_history_overhead 500000 9
python3 bench/torch_history.py
echo "== 6. 16 threads with history"
for h in off none native; do CACHEALLOC_DEVICE=cuda $B/bench_threads 16 200000 $h; done
echo "== 7-8. analyzer on one core and on all, 3M events"
$B/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o /tmp/s3m.bin
$B/bench_analyze_throughput /tmp/s3m.bin
echo "== 9. a 3M-entry PyTorch pickle: summary against pickle.load, and _memory_viz stats"
mkdir -p /tmp/big && (time python3 testdata/pytorch/make_snapshots.py /tmp/big big 1000000) 2>&1 | tail -3
python3 - <<'PY'
import pickle, resource, subprocess, time
p = '/tmp/big/big.pickle'
best_load = min((lambda t: (pickle.load(open(p, 'rb')), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(2))
d = pickle.load(open(p, 'rb')); n = sum(len(tr) for tr in d['device_traces']); del d
def timed(cmd):
    t = time.perf_counter(); subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL); return time.perf_counter() - t
ours = min(timed(['build-h200/bin/cachealloc-analyze', 'summary', p]) for _ in range(3))
one = min(timed(['build-h200/bin/cachealloc-analyze', 'summary', p, '--decode-threads', '0']) for _ in range(2))
viz = timed(['python3', '-m', 'torch.cuda._memory_viz', 'stats', p])
print(f"{n} trace entries; pickle.load {best_load:.2f} s; cachealloc-analyze summary {ours:.2f} s (ratio {ours / best_load:.3f}), "
      f"--decode-threads 0 {one:.2f} s; _memory_viz stats {viz:.2f} s")
PY
echo "== 10. dump: 1M events, 10k distinct stacks"
CACHEALLOC_DEVICE=cuda $B/bench_dump_time 1000000 10000
python3 bench/torch_dump_time.py 1000000 10000 120
echo "== perf on the cached path, if perf is here"
if command -v perf >/dev/null; then
  CACHEALLOC_DEVICE=cuda perf stat -e cycles,instructions,cache-misses,branch-misses $B/bench_threads 1 2000000 off 2>&1 | tail -12
  CACHEALLOC_DEVICE=cuda perf record -q -g -o /tmp/perf.data $B/bench_threads 1 2000000 off >/dev/null 2>&1 &&
    perf report -i /tmp/perf.data --no-children --stdio 2>/dev/null | grep -v "^#" | grep "%" | head -30
else
  echo "perf: not installed on this host"
fi
echo "== done"; date -u
