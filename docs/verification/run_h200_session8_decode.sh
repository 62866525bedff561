#!/usr/bin/env bash
# Session 8, issue 19 item 4 on the H200: the analyzer on one core, format
# version 6 (event encoding 3) against version 5 (encoding 2), the same
# events, one binary, interleaved (docs/PERFORMANCE.md, "Analyzer decode
# (session 8), dev VM"). Binaries built here into build-h200/ (carry
# build-h200/bin and build-h200/syslib).
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=build-h200/bin
echo "== machine"; date -u; nproc; grep -m1 "model name" /proc/cpuinfo
$B/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o /tmp/s3m.bin
$B/bench_analyze_throughput --rewrite 5 /tmp/s3m.bin /tmp/s3m_v5.bin
ls -la /tmp/s3m.bin /tmp/s3m_v5.bin
for round in 1 2 3; do
  for f in /tmp/s3m.bin /tmp/s3m_v5.bin; do
    echo "== round $round: $f"
    taskset -c 4 $B/bench_analyze_throughput "$f" 0
  done
done
echo "== blocks decoded ahead (the default thread count), version 6"
taskset -c 4-7 $B/bench_analyze_throughput /tmp/s3m.bin
echo done
