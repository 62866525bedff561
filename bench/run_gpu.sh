#!/usr/bin/env bash
# The figures of docs/PERFORMANCE.md, "On an H200, beside PyTorch's allocator",
# on a CUDA machine with PyTorch installed: cachealloc's allocator, recorder and
# analyzer with PyTorch's own figure for the same work beside each, in one run;
# then every suite on the cuda backend and every conformance sequence on the
# cuda and the simulated device (docs/VERIFICATION.md, "Every suite on the cuda
# backend" and "Conformance with PyTorch's allocator").
#
# Usage, from the repository root:
#   cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=Release && cmake --build build-rel   # the figures
#   ./dev.sh build                                                                  # the suites (build/)
#   bash bench/run_gpu.sh                        # everything
#   PART=table bash bench/run_gpu.sh             # the figures only
#   PART=suites bash bench/run_gpu.sh            # the suites and conformance only
#   PART=compare BASE=../before/build-rel/bin bash bench/run_gpu.sh
#                                                # B against BASE, alternating (bench/compare_builds.sh)
#   BASE=../before/build-rel/bin BASE_LABEL=before bash bench/run_gpu.sh
#                                                # rows 1-3 also with other binaries, rounds alternating
#
# Environment (defaults in brackets):
#   PART        all | table | suites | compare [all]
#   B           the Release binaries measured [build-rel/bin]
#   BASE        a folder of baseline binaries, run beside B in the same rounds of
#               rows 1-3; their lines start with BASE_LABEL [none]
#   BASE_LABEL  [base]
#   ROUNDS      rounds of each allocator and analyzer figure [3]
#   CPUS        the CPUs the pinned rows run on, in turn ["4 6 10 4"]
#   SUITES      the normal build's binaries, tests in SUITES/tests [build/bin]
#   CONFORMANCE_RUNS  conformance runs on the cuda device [3]
#   WORK        scratch folder for the large files [/tmp/cachealloc-bench]
#   CUDA_HOME   [/usr/local/cuda]
#   EXT         the torch extension (libcachealloc_torch.so): with it, row 2 also
#               runs our allocator through torch's API from Python and C++ [none]
#
# What each row prints, and its row in docs/PERFORMANCE.md:
#   1  a cached 4 KiB alloc+free pair, one thread, 500k pairs: ours
#      (bench_threads 1 500000 off) and PyTorch's (bench/torch_peer.cpp, built
#      here against the installed torch): "cached 4 KiB pair, one thread".
#   2  the same pair pinned to each of CPUS, best of 9 rounds, with history off,
#      on without stacks, on with native stacks, both again with the coarse
#      clock, and both again streamed to a file in $TMPDIR, against the
#      ring's (bench_history_overhead 500000 9): "the same, pinned", "history
#      on, ...", "streamed recording"; once more pinned to the first two of
#      CPUS, where the stream's writer has a CPU of its own (the streamed
#      rows' "vs ring"); PyTorch's pair from Python with its history off and
#      on (bench/torch_history.py).
#   3  the mixed workload (256 slots, 512 B-8 MiB), unpinned and pinned
#      (bench_mixed 1000000 3 off; torch_peer --mixed 1000000 3): "mixed workload".
#   4  1, 8 and 16 threads, each on its own stream, glibc's malloc as the
#      control (bench_threads N 200000 malloc|off; torch_peer N 200000):
#      "16 threads", "8 threads", "per pair per thread".
#   5  16 threads with history off, on and with native stacks
#      (bench_threads 16 200000 off|none|native): "16 threads with native stacks".
#   6  one clock read inside a critical section (bench_clock_read 5000000 5):
#      "What limits the figures", the clock.
#   7  the analyzer on a 3M-event cachealloc-synthetic file: the whole job on
#      one pinned core, the same pinned to each CPU in turn (--one-core), and
#      in ranges on every core (bench_analyze_throughput FILE 4 NPROC):
#      "analyzer, ...".
#   8  a 3M-entry pickle made by PyTorch (testdata/pytorch/make_snapshots.py big
#      1000000): `cachealloc-analyze summary` against Python's pickle.load, best
#      of 3 per round, and `python3 -m torch.cuda._memory_viz stats`:
#      "3M-entry PyTorch pickle".
#   9  the dump of 1M events from 10k distinct call paths, symbolization
#      included: ours (bench_dump_time 1000000 10000) and PyTorch's
#      _dump_snapshot (bench/torch_dump_time.py 1000000 10000 120):
#      "dump of 1M events".
set -u
PART=${PART:-all}
B=${B:-build-rel/bin}
BASE=${BASE:-}
BASE_LABEL=${BASE_LABEL:-base}
ROUNDS=${ROUNDS:-3}
CPUS=${CPUS:-4 6 10 4}
SUITES=${SUITES:-build/bin}
CONFORMANCE_RUNS=${CONFORMANCE_RUNS:-3}
WORK=${WORK:-/tmp/cachealloc-bench}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
case "$PART" in all|table|suites) ;;
  compare) CACHEALLOC_DEVICE=cuda exec bash bench/compare_builds.sh ;;
  *) echo "PART must be all, table, suites or compare" >&2; exit 2 ;; esac
export LD_LIBRARY_PATH=$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
mkdir -p "$WORK"

# run NAME ARGS...: B's NAME, then BASE's beside it (its lines prefixed), each
# with $PIN in front when set (PIN="taskset -c 4" run ...).
run() {
  local name=$1; shift
  ${PIN:-} "$B/$name" "$@"
  [ -z "$BASE" ] || ${PIN:-} "$BASE/$name" "$@" 2>&1 | sed "s|^|$BASE_LABEL: |"
}

echo "== machine"; date -u; nproc
lscpu | grep -E "Model name|Thread\(s\) per core|Core\(s\) per socket|Socket"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

if [ "$PART" != suites ]; then
  for f in bench_threads bench_history_overhead bench_mixed bench_clock_read bench_analyze_throughput \
           bench_dump_time cachealloc-synthetic cachealloc-analyze; do
    [ -x "$B/$f" ] || { echo "missing $B/$f: build Release into $(dirname "$B") first" >&2; exit 2; }
  done
  export CACHEALLOC_DEVICE=cuda
  T=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
  echo "== PyTorch's allocator, built here (bench/torch_peer.cpp)"
  g++ -O2 -std=c++17 bench/torch_peer.cpp -Ibench -I"$T/include" -L"$T/lib" -lc10_cuda -lc10 -I"$CUDA_HOME/include" \
      -L"$CUDA_HOME/lib64" -lcudart -ldl -Wl,-rpath,"$T/lib" -o "$WORK/torch_peer" || exit 1
  P=$WORK/torch_peer

  echo "== 1. cached 4 KiB pair, one thread: ours, PyTorch ($ROUNDS rounds)"
  for r in $(seq "$ROUNDS"); do run bench_threads 1 500000 off; "$P" 1 500000; done

  echo "== 2. the same pinned, best of 9: history off, on without stacks, with native stacks, coarse clock, streamed"
  for c in $CPUS; do echo "-- cpu $c"; PIN="taskset -c $c" run bench_history_overhead 500000 9; done
  TWO=$(echo $CPUS | awk '{print $1 "," $2}')
  echo "-- cpus $TWO: the same, so that a streamed mode's writer has a CPU of its own"
  PIN="taskset -c $TWO" run bench_history_overhead 500000 9
  echo "-- the pair from Python through torch's API, history off and on, 1, 10 and 30 frames deep: PyTorch's allocator, then ours (EXT)"
  for depth in 1 10 30; do
    python3 bench/torch_history.py "$depth"
    [ -z "${EXT:-}" ] || CACHEALLOC_TORCH_LIBRARY=$EXT python3 bench/torch_history.py "$depth" --allocator cachealloc
  done
  if [ -n "${EXT:-}" ]; then
    echo "-- torch's raw_alloc/raw_delete from C++ (bench/torch_peer.cpp): PyTorch's allocator, ours through torch (EXT), our C++ API ($ROUNDS rounds)"
    for r in $(seq "$ROUNDS"); do
      "$P" --default 1000000 5; CACHEALLOC_TORCH_LIBRARY=$EXT "$P" --default 1000000 5
      "$P" --default 300000 5 --history; CACHEALLOC_TORCH_LIBRARY=$EXT "$P" --default 300000 5 --history
      "$P" 1 500000; CACHEALLOC_TORCH_LIBRARY=$EXT "$P" 1 500000; "$B/bench_threads" 1 500000 off | tail -1
      "$P" 16 200000; CACHEALLOC_TORCH_LIBRARY=$EXT "$P" 16 200000; "$B/bench_threads" 16 200000 off | tail -1
    done
  fi

  echo "== 3. mixed workload, 256 slots, 512 B-8 MiB, one thread: ours, PyTorch ($ROUNDS rounds)"
  for r in $(seq "$ROUNDS"); do run bench_mixed 1000000 3 off; "$P" --mixed 1000000 3; done
  echo "-- pinned"
  for c in $CPUS; do echo "-- cpu $c"; PIN="taskset -c $c" run bench_mixed 1000000 3 off | grep -E 'ns per free\+alloc'; done

  echo "== 4. 1, 8 and 16 threads, each on its own stream: glibc control, ours, PyTorch (2 rounds)"
  for r in 1 2; do for n in 1 8 16; do
    "$B/bench_threads" "$n" 200000 malloc
    "$B/bench_threads" "$n" 200000 off
    "$P" "$n" 200000
  done; done

  echo "== 5. 16 threads with history off, on without stacks, with native stacks (2 rounds)"
  for r in 1 2; do for h in off none native; do "$B/bench_threads" 16 200000 "$h"; done; done

  echo "== 6. one clock read inside a critical section"
  taskset -c "${CPUS%% *}" "$B/bench_clock_read" 5000000 5

  echo "== 7. the analyzer on 3M events: one core, each CPU in turn, ranges on every core"
  S=$WORK/s3m.bin
  "$B/cachealloc-synthetic" --events 3000000 --seed 1 --stacks native --threads 1 -f -o "$S"
  for r in $(seq "$ROUNDS"); do taskset -c "${CPUS%% *}" "$B/bench_analyze_throughput" "$S" 0 1 | grep -E "file:|one core|alone"; done
  echo "-- the one-core job pinned to each CPU in turn (best of 3 each)"
  for c in $(seq 0 $(($(nproc) - 1))); do
    echo "cpu $c: $(taskset -c "$c" "$B/bench_analyze_throughput" --one-core "$S")"
  done
  for r in $(seq "$ROUNDS"); do "$B/bench_analyze_throughput" "$S" 4 "$(nproc)" | grep -E "in ranges|decode on"; done

  echo "== 8. a 3M-entry PyTorch pickle: summary against pickle.load; _memory_viz stats"
  [ -f "$WORK/big.pickle" ] || python3 testdata/pytorch/make_snapshots.py "$WORK" big 1000000 | tail -2
  PICKLE=$WORK/big.pickle ANALYZE=$B/cachealloc-analyze ROUNDS=$ROUNDS python3 - <<'PY'
import os, pickle, subprocess, time
p, analyze, rounds = os.environ['PICKLE'], os.environ['ANALYZE'], int(os.environ['ROUNDS'])
def load_time():
    t = time.perf_counter(); pickle.load(open(p, 'rb')); return time.perf_counter() - t
best_load = min(load_time() for _ in range(3))
d = pickle.load(open(p, 'rb')); n = sum(len(tr) for tr in d['device_traces']); del d
def timed(cmd):
    t = time.perf_counter(); subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL); return time.perf_counter() - t
for r in range(1, rounds + 1):
    ours = min(timed([analyze, 'summary', p]) for _ in range(3))
    print(f"round {r}: {n} trace entries; pickle.load {best_load:.2f} s; summary {ours:.3f} s (ratio {ours / best_load:.3f})")
print(f"_memory_viz stats {timed(['python3', '-m', 'torch.cuda._memory_viz', 'stats', p]):.2f} s")
PY

  echo "== 9. dump: 1M events, 10k distinct call paths: ours, PyTorch"
  run bench_dump_time 1000000 10000
  python3 bench/torch_dump_time.py 1000000 10000 120
  unset CACHEALLOC_DEVICE
fi

if [ "$PART" != table ]; then
  [ -d "$SUITES/tests" ] || { echo "missing $SUITES/tests: run ./dev.sh build first" >&2; exit 2; }
  echo "== every suite on the cuda backend"
  # test_install_consumer installs and builds a project; test_browser_report
  # drives Chromium: neither touches the device.
  for t in "$SUITES"/tests/test_*; do
    case $(basename "$t") in test_install_consumer|test_browser_report) continue ;; esac
    r=$(CACHEALLOC_TEST_DEVICE=cuda timeout 300 "$t" 2>&1 | grep -E "test cases:|Status" | tr '\n' ' ')
    echo "$(basename "$t"): ${r:-no summary (crashed or timed out)}"
  done
  echo "== conformance: every sequence on the cuda device ($CONFORMANCE_RUNS runs), then on the simulated device"
  C=$SUITES/cachealloc-conformance
  total=$(ls testdata/conformance/*.csv | wc -l)
  for r in $(seq "$CONFORMANCE_RUNS"); do
    "$C" --device cuda testdata/conformance/*.csv > "$WORK/conformance$r.txt" 2>&1
    echo "cuda run $r: $(grep -cE " ([0-9]+)/\1 rows match$" "$WORK/conformance$r.txt") of $total match"
    grep -E "first mismatch|note:" "$WORK/conformance$r.txt" | cut -c1-240 | head -8
  done
  echo "simulated: $("$C" testdata/conformance/*.csv 2>&1 | grep -cE " ([0-9]+)/\1 rows match$") of $total match"
fi
echo "== done"; date -u
