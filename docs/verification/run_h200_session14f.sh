#!/usr/bin/env bash
# Session 14 on the H200, sixth call: the session's last code (49ddc4e: the
# pool lock's waiters yield before they sleep): every suite on the cuda
# backend and conformance (PART=suites of run_h200_session14.sh), then one
# stream shared by 2, 4, 8 and 16 threads (the contended lock), and the
# pinned pair.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
PART=suites SUITES=build-h200/suites.txz CACHEALLOC_SOURCE=/work/main bash docs/verification/run_h200_session14.sh
echo "== one stream shared by T threads (2 rounds)"
for r in 1 2; do for t in 2 4 8 16; do CACHEALLOC_DEVICE=cuda build-h200/rel/bench_threads $t 200000 off shared | head -1; done; done
echo "== own streams, 1 and 16 threads"
for t in 1 16; do CACHEALLOC_DEVICE=cuda build-h200/rel/bench_threads $t 200000 off | head -2; done
echo "== pinned pair (taskset -c 4)"
taskset -c 4 build-h200/rel/bench_history_overhead 500000 9 | tail -5
echo "== done"; date -u
