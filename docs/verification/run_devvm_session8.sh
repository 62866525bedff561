#!/usr/bin/env bash
# Session 8, the CPU-only figures of issue 19 on the 2-core dev VM (docs/PERFORMANCE.md,
# "Issue 19's CPU-only figures on the dev VM, session 8"): the analyzer, pickles and the dump,
# before (e4cd759) and after, Release, run with nothing else on the machine.
#   A=before/bin B=after/bin bash docs/verification/run_devvm_session8.sh
set -u
A=${A:?before binaries}; B=${B:?after binaries}
echo "== machine"; date -u; nproc; grep -m1 "model name" /proc/cpuinfo; uptime
echo "== analyzer, 3M events: before (format 5), after (format 6), after on the same events as format 5"
$A/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o /tmp/dv-before.bin
$B/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o /tmp/dv.bin
$B/bench_analyze_throughput --rewrite 5 /tmp/dv.bin /tmp/dv_v5.bin
for r in 1 2; do
  echo "-- round $r"
  $A/bench_analyze_throughput /tmp/dv-before.bin
  $B/bench_analyze_throughput /tmp/dv.bin
  $B/bench_analyze_throughput /tmp/dv_v5.bin
done
echo "== PyTorch-shaped pickle, 1M allocations (3M trace entries): summary against pickle.load, before and after"
[ -f /tmp/pl8.pickle ] || python3 bench/pickle_vs_python.py /tmp/pl8.pickle $B/cachealloc-analyze --make 1000000 --runs 1 >/dev/null
python3 bench/pickle_vs_python.py /tmp/pl8.pickle $A/cachealloc-analyze --runs 3
python3 bench/pickle_vs_python.py /tmp/pl8.pickle $B/cachealloc-analyze --runs 3
echo "== pickles of our own convert, 1M / 3M / 5M events, after"
python3 bench/pickle_vs_python.py /tmp/ours8 $B/cachealloc-analyze --convert 1000000 3000000 5000000
echo "== dump: 1M events, 10k distinct stacks: before, after (2 rounds)"
for r in 1 2; do
  CACHEALLOC_DEVICE=simulated $A/bench_dump_time 1000000 10000
  CACHEALLOC_DEVICE=simulated $B/bench_dump_time 1000000 10000
done
echo "== done"; date -u; uptime
