#!/usr/bin/env bash
# Session 11 on the H200 (docs/PERFORMANCE.md, "Recording on the H200,
# session 11"): one observer call per critical section and the coarse clock
# (871d05e) against the end of session 10 (5fe99db), side by side in one run.
# Release binaries built on the dev VM from clean worktrees
# (build-h200/before, build-h200/after), with the library they need
# (build-h200/syslib); then every suite (SUITES, an xz tar of the
# RelWithDebInfo test binaries and CLI programs of the same commit) on the
# cuda backend, and conformance on both devices.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=build-h200/after
A=build-h200/before
echo "== machine"; date -u; nproc; lscpu | grep -E "Model name|Thread\(s\) per core"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import time; print('coarse resolution', time.clock_getres(6))"  # CLOCK_MONOTONIC_COARSE
echo "== one thread, pinned: before, after (3 rounds); after adds the coarse clock's two modes"
for r in 1 2 3; do taskset -c 2 $A/bench_history_overhead 500000 9; taskset -c 2 $B/bench_history_overhead 500000 9; done
echo "== the same, not pinned (2 rounds)"
for r in 1 2; do $A/bench_history_overhead 500000 9; $B/bench_history_overhead 500000 9; done
echo "== 16 threads: off, none, native; before, after (2 rounds)"
for r in 1 2; do for h in off none native; do
  CACHEALLOC_DEVICE=cuda $A/bench_threads 16 200000 $h | tail -n 3; CACHEALLOC_DEVICE=cuda $B/bench_threads 16 200000 $h | tail -n 3
done; done
if [ -n "${SUITES:-}" ]; then
  SRC=${CACHEALLOC_SOURCE:-/work/main}
  [ -e "$SRC" ] || { mkdir -p "$(dirname "$SRC")" && cp -a . "$SRC"; }
  mkdir -p "$SRC/build" && tar -C "$SRC/build" -xJf "$SUITES"
  echo "== every suite on the cuda backend"
  for t in $SRC/build/bin/tests/test_*; do
    case $(basename $t) in test_install_consumer|test_browser_report) continue ;; esac
    r=$(cd $SRC && CACHEALLOC_TEST_DEVICE=cuda timeout 240 $t 2>&1 | grep -E "test cases:|Status" | tr '\n' ' '); echo "$(basename $t): $r"
  done
  echo "== conformance: every sequence, cuda device, then simulated"
  C=$SRC/build/bin/cachealloc-conformance
  # a passing sequence prints "N/N rows match"; a failing one "M/N rows match; first mismatch ..."
  $C --device cuda testdata/conformance/*.csv 2>&1 | grep -cE " ([0-9]+)/\1 rows match$"
  $C --device cuda testdata/conformance/*.csv 2>&1 | grep -E "first mismatch" | head -8
  $C testdata/conformance/*.csv 2>&1 | grep -cE " ([0-9]+)/\1 rows match$"
fi
echo "== done"; date -u
