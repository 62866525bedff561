#!/usr/bin/env bash
# Session 15's last H200 call (docs/PERFORMANCE.md, "Issue 19's table on the
# H200, session 15"): every suite on the cuda backend and conformance with
# the session's last code (SUITES), then the huge-page advice and the
# affinity-mask thread counts, before (build-h200/before, 64005cc) against
# after (build-h200/rel, e88a7f8), rounds alternating.
#   SUITES=build-h200/suites.txz bash docs/verification/run_h200_session15d.sh
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=build-h200/rel
A=build-h200/before
echo "== machine"; date -u; nproc; lscpu | grep -E "Model name"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PART=suites bash docs/verification/run_h200_session15.sh 2>&1 | sed -n '/== every suite/,$p'
echo "== first touch per 4 KiB page"
$B/bench_page_faults 256 3
$B/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -f -o /tmp/s3m.bin
ms() { local t0 t1; t0=$(date +%s%N); "$@" > /dev/null; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 )); }
echo "== cachealloc-analyze summary on 3M events, one process each: before / after, ms (8 rounds each way)"
for cpus in 0-15 4 4,5; do
  b=""; a=""
  for r in 1 2 3 4 5 6 7 8; do
    b="$b $(ms taskset -c $cpus $A/cachealloc-analyze summary /tmp/s3m.bin)"
    a="$a $(ms taskset -c $cpus $B/cachealloc-analyze summary /tmp/s3m.bin)"
  done
  echo "taskset -c $cpus: before$b | after$a"
done
echo "== the analyzer benchmark, before / after (taskset -c 4-7, 4 cores: decode ahead on 3)"
for r in 1 2; do
  taskset -c 4-7 $A/bench_analyze_throughput /tmp/s3m.bin 3 4 | grep -E "one core|decode on|load everything|streaming|RSS" | sed 's/^/before: /'
  taskset -c 4-7 $B/bench_analyze_throughput /tmp/s3m.bin 3 4 | grep -E "one core|decode on|load everything|streaming|RSS" | sed 's/^/after:  /'
done
echo "== done"; date -u
