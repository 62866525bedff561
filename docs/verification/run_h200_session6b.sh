#!/usr/bin/env bash
# Session 6, second H200 call (docs/VERIFICATION.md, docs/PERFORMANCE.md):
# the cuda conformance sequence the first call showed differing, in full;
# the cached path after the lazy stats publishing (commit 988ef2d), ours
# and PyTorch's side by side; ranks and --sweep scaling with threads; and
# issue 16's recommendation run for real (run_h200_issue16_sweep.sh).
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
SRC=${CACHEALLOC_SOURCE:-/work/main}
[ -e "$SRC" ] || { mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC"; }
B=build-h200/bin
T=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
echo "== machine"; date -u; nproc; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
echo "== conformance on the cuda device: every sequence that differs, in full"
$B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | grep -v "rows match$"
echo "== cached path: ours (lazy publishing) and PyTorch's, interleaved"
g++ -O2 -std=c++17 bench/torch_peer.cpp -Ibench -I$T/include -L$T/lib -lc10_cuda -lc10 -I/usr/local/cuda/include \
    -L/usr/local/cuda/lib64 -lcudart -ldl -Wl,-rpath,$T/lib -o /tmp/torch_peer 2>&1 | tail -3
for r in 1 2 3; do CACHEALLOC_DEVICE=cuda $B/bench_threads 1 500000 off; /tmp/torch_peer 1 500000; done
CACHEALLOC_DEVICE=cuda $B/bench_mixed 1000000 3 off; /tmp/torch_peer --mixed 1000000 3
for r in 1 2; do CACHEALLOC_DEVICE=cuda $B/bench_threads 16 200000 off; /tmp/torch_peer 16 200000; done
taskset -c 2 $B/bench_history_overhead 500000 9
echo "== ranks over 64 files, 1..16 threads"
timeout 120 $B/bench_ranks_scaling --dir /tmp/ranks64 --files 64 --threads 1,2,4,8,16
echo "== issue 16: sweep, recommend, the recommendation for real"
OUT=$OUT/i16s timeout 200 bash docs/verification/run_h200_issue16_sweep.sh
echo "== done"; date -u
