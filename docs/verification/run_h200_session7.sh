#!/usr/bin/env bash
# Session 7 on the H200 (docs/VERIFICATION.md, docs/PERFORMANCE.md): every
# suite on the cuda backend and every conformance sequence on both devices
# after this session's allocator changes (the pointer map's 1,024 shards, the
# replay's private pools), then the thread-scaling figures of issue 19 with
# the per-thread spread and the glibc control, before (build-h200-before:
# HEAD of session 6 with the new bench_threads.cpp) and after, PyTorch's
# allocator beside them in this one run, and the single-replay throughput of
# issue 16 on one core. Binaries built Release on the dev VM from clean
# worktrees; test binaries name their sources by $CACHEALLOC_SOURCE.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
SRC=${CACHEALLOC_SOURCE:-/work/main}
[ -e "$SRC" ] || { mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC"; }
B=build-h200/bin
A=build-h200-before/bin
T=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
echo "== machine"; date -u; nproc; lscpu | grep -E "Model name|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)" 
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'
if [ "${SKIP_SUITES:-0}" != 1 ]; then
  echo "== every suite on the cuda backend"
  for t in $B/tests/test_*; do
    case $(basename $t) in test_install_consumer|test_browser_report) continue ;; esac
    r=$(CACHEALLOC_TEST_DEVICE=cuda timeout 240 $t 2>&1 | grep -E "test cases:|Status"); echo "$(basename $t): $r"
  done
  echo "== conformance: every sequence, cuda device"
  $B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | grep -c "rows match"
  $B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | grep -v "rows match" | tail -8
  echo "== conformance: every sequence, simulated device"
  $B/cachealloc-conformance testdata/conformance/*.csv 2>&1 | grep -c "rows match"
  $B/cachealloc-conformance testdata/conformance/*.csv 2>&1 | grep -v "rows match" | tail -8
fi
echo "== PyTorch's allocator built here"
g++ -O2 -std=c++17 bench/torch_peer.cpp -Ibench -I$T/include -L$T/lib -lc10_cuda -lc10 -I/usr/local/cuda/include \
    -L/usr/local/cuda/lib64 -lcudart -ldl -Wl,-rpath,$T/lib -o /tmp/torch_peer 2>&1 | tail -3
echo "== threads: glibc control, before, after, PyTorch (2 rounds)"
for r in 1 2; do
  for n in 1 16; do
    CACHEALLOC_DEVICE=cuda $B/bench_threads $n 200000 malloc
    CACHEALLOC_DEVICE=cuda $A/bench_threads $n 200000 off
    CACHEALLOC_DEVICE=cuda $B/bench_threads $n 200000 off
    /tmp/torch_peer $n 200000
  done
done
echo "== threads 8: before, after"
for r in 1 2; do CACHEALLOC_DEVICE=cuda $A/bench_threads 8 200000 off; CACHEALLOC_DEVICE=cuda $B/bench_threads 8 200000 off; done
echo "== 16 threads with history, after"
for h in none native; do CACHEALLOC_DEVICE=cuda $B/bench_threads 16 200000 $h; done
echo "== cached pair, one thread: before, after, PyTorch (3 rounds)"
for r in 1 2 3; do CACHEALLOC_DEVICE=cuda $A/bench_threads 1 500000 off; CACHEALLOC_DEVICE=cuda $B/bench_threads 1 500000 off; /tmp/torch_peer 1 500000; done
if [ -x $B/bench_replay_throughput ]; then
  echo "== issue 16: one replay on one core"
  $B/cachealloc-synthetic --events 3000000 --seed 1 --stacks none -o /tmp/s3m.bin
  taskset -c 3 $B/bench_replay_throughput /tmp/s3m.bin 3
fi
echo "== done"; date -u
