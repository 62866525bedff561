#!/usr/bin/env bash
# Session 16, the CPU-only figures of issue 19 on the 2-core dev VM (docs/PERFORMANCE.md,
# "Issue 19's CPU-only figures on the 2-core dev VM, session 16"): the analyzer on one core and in
# parallel ranges on both, pickles against Python's pickle.load, and the dump. Release, run with
# nothing else on the machine.
#   B=build-rel/bin bash docs/verification/run_devvm_session16.sh
set -u
B=${B:?binaries}
echo "== machine"; date -u; nproc; grep -m1 "model name" /proc/cpuinfo; uptime
echo "== analyzer, 3M events (format 6): one core, decode on the second core, ranges on 2 threads (3 rounds)"
$B/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -f -o /tmp/dv12.bin
for r in 1 2 3; do echo "-- round $r"; $B/bench_analyze_throughput /tmp/dv12.bin 1 2; done
echo "-- the one-core job pinned to each CPU (best of 3 each), twice"
for r in 1 2; do for c in 0 1; do echo "cpu $c: $(taskset -c $c $B/bench_analyze_throughput --one-core /tmp/dv12.bin)"; done; done
echo "== PyTorch-shaped pickle, 1M allocations (3M trace entries): summary against pickle.load"
[ -f /tmp/pl12.pickle ] || python3 bench/pickle_vs_python.py /tmp/pl12.pickle $B/cachealloc-analyze --make 1000000 --runs 1 >/dev/null
python3 bench/pickle_vs_python.py /tmp/pl12.pickle $B/cachealloc-analyze --runs 3
echo "== pickles of our own convert, 1M / 3M / 5M events"
python3 bench/pickle_vs_python.py /tmp/ours12 $B/cachealloc-analyze --convert 1000000 3000000 5000000
echo "== dump: 1M events, 10k distinct stacks (2 rounds)"
for r in 1 2; do CACHEALLOC_DEVICE=simulated $B/bench_dump_time 1000000 10000; done
echo "== done"; date -u; uptime
