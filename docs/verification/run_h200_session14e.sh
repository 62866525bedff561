#!/usr/bin/env bash
# Session 14 on the H200, fifth call: the cached pair again, this session's
# last code (b9e40f9, build-h200/rel) against session 13's (build-h200/s13),
# pinned to three CPUs in turn (the third call's instance ran slow on CPU 2:
# session 13's code there was 113 ns against 100-104 in the first call), with
# history on; then 16 threads.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
echo "== machine"; date -u; nproc
for c in 2 4 9; do for r in 1 2; do
  echo "-- cpu $c round $r"
  taskset -c $c build-h200/rel/bench_history_overhead 500000 9 | tail -5 | sed 's/^/s14: /'
  taskset -c $c build-h200/s13/bench_history_overhead 500000 9 | tail -5 | sed 's/^/s13: /'
done; done
for r in 1 2; do for b in rel s13; do
  CACHEALLOC_DEVICE=cuda build-h200/$b/bench_threads 1 500000 off | sed "s/^/$b: /"
  CACHEALLOC_DEVICE=cuda build-h200/$b/bench_threads 16 200000 off | sed "s/^/$b: /"
done; done
echo "== done"; date -u
