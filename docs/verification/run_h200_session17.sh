#!/usr/bin/env bash
# Session 17 on the H200 (docs/PERFORMANCE.md, "Issue 19's table on the H200,
# session 17"): every figure of issue 19's table with the session's last code
# (build-h200/rel), PyTorch beside it in the same run, and the allocator rows
# also with session 16's code (build-h200/base, 50b17a7) in alternating rounds;
# then every suite on the cuda backend and every conformance sequence.
# Release binaries built on the dev VM, the libraries they need in
# build-h200/syslib; SUITES: an xz tar of the RelWithDebInfo test binaries.
#   PART=table bash docs/verification/run_h200_session17.sh
#   PART=suites SUITES=build-h200/suites.txz bash docs/verification/run_h200_session17.sh
set -u
PART=${PART:-all}
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
B=build-h200/rel
A=build-h200/base
T=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
echo "== machine"; date -u; nproc; lscpu | grep -E "Model name|Thread\(s\) per core|Core\(s\) per socket|Socket|MHz"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'
if [ "$PART" != suites ]; then
echo "== PyTorch's allocator built here"
g++ -O2 -std=c++17 bench/torch_peer.cpp -Ibench -I$T/include -L$T/lib -lc10_cuda -lc10 -I/usr/local/cuda/include \
    -L/usr/local/cuda/lib64 -lcudart -ldl -Wl,-rpath,$T/lib -o /tmp/torch_peer 2>&1 | tail -3
echo "== 1. cached 4 KiB pair, one thread: session 16, ours, PyTorch (3 rounds)"
for r in 1 2 3; do
  CACHEALLOC_DEVICE=cuda $A/bench_threads 1 500000 off | sed 's/^/s16: /'
  CACHEALLOC_DEVICE=cuda $B/bench_threads 1 500000 off
  /tmp/torch_peer 1 500000
done
echo "== 1b. pinned, best of 9, with history on: rows 1, 4 and 5 (session 16, then ours)"
for c in 4 6 10 4; do
  echo "-- cpu $c"; taskset -c $c $A/bench_history_overhead 500000 9 | sed 's/^/s16: /'
  taskset -c $c $B/bench_history_overhead 500000 9
done
python3 bench/torch_history.py
echo "== 2. mixed workload, 256 slots, 512 B-8 MiB, one thread: session 16, ours, PyTorch (3 rounds)"
for r in 1 2 3; do
  CACHEALLOC_DEVICE=cuda $A/bench_mixed 1000000 3 off | sed 's/^/s16: /'
  CACHEALLOC_DEVICE=cuda $B/bench_mixed 1000000 3 off
  /tmp/torch_peer --mixed 1000000 3
done
echo "-- pinned to CPUs 4 and 6: session 16, ours"
for c in 4 6 4 6; do
  echo "cpu $c s16: $(CACHEALLOC_DEVICE=cuda taskset -c $c $A/bench_mixed 1000000 3 off | grep -o '[0-9.]* ns per free+alloc')"
  echo "cpu $c new: $(CACHEALLOC_DEVICE=cuda taskset -c $c $B/bench_mixed 1000000 3 off | grep -o '[0-9.]* ns per free+alloc')"
done
echo "== 3. threads at 1, 8, 16: glibc control, ours, PyTorch (2 rounds)"
for r in 1 2; do for n in 1 8 16; do
  CACHEALLOC_DEVICE=cuda $B/bench_threads $n 200000 malloc
  CACHEALLOC_DEVICE=cuda $B/bench_threads $n 200000 off
  /tmp/torch_peer $n 200000
done; done
echo "== 4-6. 16 threads with history: off, none, native (2 rounds)"
for r in 1 2; do for h in off none native; do CACHEALLOC_DEVICE=cuda $B/bench_threads 16 200000 $h; done; done
echo "== 7-8. analyzer on one core and on all, 3M events"
$B/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -f -o /tmp/s3m.bin
for r in 1 2 3; do taskset -c 4 $B/bench_analyze_throughput /tmp/s3m.bin 0 1 | grep -E "file:|one core|alone"; done
echo "-- the one-core job pinned to each CPU in turn (best of 3 each)"
for c in $(seq 0 $(($(nproc) - 1))); do
  echo "cpu $c: $(taskset -c $c $B/bench_analyze_throughput --one-core /tmp/s3m.bin)"
done
for r in 1 2 3; do $B/bench_analyze_throughput /tmp/s3m.bin 4 16 | grep -E "in ranges|decode on"; done
echo "== 9. a 3M-entry PyTorch pickle: summary against pickle.load; _memory_viz stats"
mkdir -p /tmp/big && (time python3 testdata/pytorch/make_snapshots.py /tmp/big big 1000000) 2>&1 | tail -4
python3 - <<'PY'
import pickle, subprocess, time
p = '/tmp/big/big.pickle'
best_load = min((lambda t: (pickle.load(open(p, 'rb')), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(3))
d = pickle.load(open(p, 'rb')); n = sum(len(tr) for tr in d['device_traces']); del d
def timed(cmd):
    t = time.perf_counter(); subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL); return time.perf_counter() - t
for r in (1, 2, 3):
    ours = min(timed(['build-h200/rel/cachealloc-analyze', 'summary', p]) for _ in range(3))
    print(f"round {r}: {n} trace entries; pickle.load {best_load:.2f} s; summary {ours:.3f} s (ratio {ours / best_load:.3f})")
viz = timed(['python3', '-m', 'torch.cuda._memory_viz', 'stats', p])
print(f"_memory_viz stats {viz:.2f} s")
PY
echo "== 10. dump: 1M events, 10k distinct stacks: ours, PyTorch"
CACHEALLOC_DEVICE=cuda $B/bench_dump_time 1000000 10000
python3 bench/torch_dump_time.py 1000000 10000 120
fi
if [ "$PART" != table ] && [ -n "${SUITES:-}" ]; then
  PART=suites SUITES=$SUITES bash docs/verification/run_h200_session15.sh 2>&1 | sed -n '/== every suite/,$p'
fi
echo "== done"; date -u
