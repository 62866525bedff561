#!/usr/bin/env bash
# Session 10 on the H200 (docs/PERFORMANCE.md, "Recording on the H200,
# session 10"): the recorder's compact records and unordered clock read
# (22c6e4b and after) against the end of session 9 (3bc6786), side by side in
# one run. Binaries built Release on the dev VM from clean worktrees
# (build-h200/before, build-h200/after) with the libraries they need
# (build-h200/syslib) and Debian's perf (build-h200/perf).
#   PART=record|suites|all (default record)
#   suites: SUITES_BIN (test binaries, RelWithDebInfo, debug info stripped but
#   for the symbolizing ones) and CACHEALLOC_SOURCE, where they were built.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
PART=${PART:-record}
B=build-h200/after
A=build-h200/before
echo "== machine"; date -u; nproc; lscpu | grep -E "Model name|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
perf() { LD_LIBRARY_PATH=$PWD/build-h200/perf:$LD_LIBRARY_PATH "$PWD/build-h200/perf/perf" "$@"; }
if [ "$PART" != suites ]; then
  echo "== the kernel's tick (CLOCK_MONOTONIC_COARSE's resolution)"
  uname -r; grep -E "^CONFIG_HZ=" /boot/config-$(uname -r) 2>/dev/null || echo "no kernel config readable"
  python3 -c "import time; print('coarse resolution', time.clock_getres(time.CLOCK_MONOTONIC_COARSE))"
  echo "== clock read inside a lock"
  taskset -c 2 $B/bench_clock_read 5000000 5
  echo "== history on, no stacks and native stacks, against off, one thread, pinned: before, after (3 rounds)"
  for r in 1 2 3; do taskset -c 2 $A/bench_history_overhead 500000 9; taskset -c 2 $B/bench_history_overhead 500000 9; done
  echo "== the same, not pinned (2 rounds)"
  for r in 1 2; do $A/bench_history_overhead 500000 9; $B/bench_history_overhead 500000 9; done
  echo "== 16 threads: off, none, native; before, after (2 rounds)"
  for r in 1 2; do for h in off none native; do
    CACHEALLOC_DEVICE=cuda $A/bench_threads 16 200000 $h; CACHEALLOC_DEVICE=cuda $B/bench_threads 16 200000 $h
  done; done
  echo "== dump: 1M events, 10k distinct stacks: before, after"
  CACHEALLOC_DEVICE=cuda $A/bench_dump_time 1000000 10000; CACHEALLOC_DEVICE=cuda $B/bench_dump_time 1000000 10000
  CACHEALLOC_DEVICE=cuda $A/bench_dump_time 1000000 10000; CACHEALLOC_DEVICE=cuda $B/bench_dump_time 1000000 10000
  echo "== mixed workload, history off: before, after (2 rounds)"
  for r in 1 2; do CACHEALLOC_DEVICE=cuda $A/bench_mixed 1000000 3 off; CACHEALLOC_DEVICE=cuda $B/bench_mixed 1000000 3 off; done
  echo "== perf: where a pair's recording time goes, after (history none, then native)"
  perf --version
  for v in $A $B; do
    echo "-- perf stat $v bench_history_overhead"
    perf stat -e cycles,instructions,cache-misses taskset -c 2 $v/bench_history_overhead 500000 3 2>&1 | tail -14
  done
  perf record -q -o /tmp/perf.data taskset -c 2 $B/bench_history_overhead 500000 5 > /dev/null 2>&1
  perf report -i /tmp/perf.data --no-children --stdio 2>/dev/null | grep -v "^#" | grep -E "^ +[0-9.]+%" | head -25
  perf annotate -i /tmp/perf.data --stdio -s cachealloc::HistoryRecorder::on_event 2>/dev/null | grep -E "^\s+[0-9]+\.[0-9]+ :" | sort -rn | head -20
  echo "-- perf record: 16 threads native"
  CACHEALLOC_DEVICE=cuda perf record -q -o /tmp/perf16.data $B/bench_threads 16 200000 native 2>&1 | tail -3
  perf report -i /tmp/perf16.data --no-children --stdio 2>/dev/null | grep -v "^#" | grep -E "^ +[0-9.]+%" | head -20
fi
if [ "$PART" != record ]; then
  SRC=${CACHEALLOC_SOURCE:-/work/main}
  [ -e "$SRC" ] || { mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC"; }
  echo "== every suite on the cuda backend"
  for t in $SUITES_BIN/tests/test_*; do
    case $(basename $t) in test_install_consumer|test_browser_report) continue ;; esac
    r=$(CACHEALLOC_TEST_DEVICE=cuda timeout 240 $t 2>&1 | grep -E "test cases:|Status"); echo "$(basename $t): $r"
  done
  echo "== conformance: every sequence, cuda device, then simulated"
  $B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | grep -c "rows match"
  $B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | grep -v "rows match" | tail -8
  $B/cachealloc-conformance testdata/conformance/*.csv 2>&1 | grep -c "rows match"
fi
echo "== done"; date -u
