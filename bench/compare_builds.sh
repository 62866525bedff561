#!/usr/bin/env bash
# Two builds of the allocator and analyzer benchmarks side by side, in
# alternating rounds on the same machine: what a change costs or saves.
# bench/run_gpu.sh and bench/run_cpu.sh call it as PART=compare; the device
# is whatever CACHEALLOC_DEVICE says (cuda on a GPU machine, simulated here).
#
# Usage, from the repository root, with two Release builds:
#   B=build-rel/bin BASE=../before/build-rel/bin BASE_LABEL=before bash bench/compare_builds.sh
#
# Environment (defaults in brackets):
#   B, BASE     the two folders of binaries [build-rel/bin, required]
#   BASE_LABEL  the prefix of BASE's lines [base]
#   LABEL       the prefix of B's lines [new]
#   ROUNDS      alternating rounds [3]
#   CPU         the CPU every row is pinned to [1]
#   WORK        scratch folder for the 3M-event snapshot [/tmp/cachealloc-bench]
#
# Rows (each binary prints its own figure):
#   mixed     bench_mixed 1000000 3 off: 256 slots, 512 B-8 MiB, ns per free+alloc
#   pair      bench_threads 1 500000 off: a cached 4 KiB pair, one thread
#   history   bench_history_overhead 500000 5: the pair with history off, on, native stacks
#   threads   bench_threads 8 100000 off: 8 threads on their own streams, aggregate per pair
#   analyzer  bench_analyze_throughput --one-core on 3M events (best of 3), M events/s
#   replay    bench_replay_throughput on the same file, M events/s through the allocator
set -u
B=${B:-build-rel/bin}
BASE=${BASE:?BASE: the folder of the baseline binaries}
BASE_LABEL=${BASE_LABEL:-base}
LABEL=${LABEL:-new}
ROUNDS=${ROUNDS:-3}
CPU=${CPU:-1}
WORK=${WORK:-/tmp/cachealloc-bench}
mkdir -p "$WORK"
for d in "$B" "$BASE"; do
  for f in bench_mixed bench_threads bench_history_overhead bench_analyze_throughput bench_replay_throughput \
           cachealloc-synthetic; do
    [ -x "$d/$f" ] || { echo "missing $d/$f" >&2; exit 2; }
  done
done
pin() { taskset -c "$CPU" "$@"; }
both() {  # both ROW CMD ARGS...: B's figure, then BASE's, each line labelled
  local row=$1 name=$2; shift 2
  pin "$B/$name" "$@" 2>&1 | sed "s|^|$LABEL $row: |"
  pin "$BASE/$name" "$@" 2>&1 | sed "s|^|$BASE_LABEL $row: |"
}
echo "== compare: $LABEL=$B against $BASE_LABEL=$BASE, pinned to CPU $CPU, device ${CACHEALLOC_DEVICE:-auto}"
date -u; uptime
S=$WORK/s3m.bin
[ -f "$S" ] || "$B/cachealloc-synthetic" --events 3000000 --seed 1 --stacks native --threads 1 -f -o "$S" >/dev/null
for r in $(seq "$ROUNDS"); do
  echo "-- round $r"
  both mixed bench_mixed 1000000 3 off | grep -E 'ns per free\+alloc'
  both pair bench_threads 1 500000 off | grep -E 'ns per pair'
  both history bench_history_overhead 500000 5 | grep -vE '^\s*$'
  both threads bench_threads 8 100000 off | grep -E 'ns per pair'
  both analyzer bench_analyze_throughput --one-core "$S"
  both replay bench_replay_throughput "$S" 1 | grep -iE 'events/s'
done
echo "== done"; date -u
