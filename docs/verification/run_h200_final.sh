#!/usr/bin/env bash
# Everything checked on the H200 in one run: suites on the cuda backend,
# PyTorch side by side, benchmarks, interop. See docs/VERIFICATION.md.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
B=build-h200/bin
T=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
echo "== machine"; date -u; nproc; lscpu | grep -E "Model name" | head -1; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
echo "== every suite on the cuda backend"
for t in $B/tests/test_*; do r=$(CACHEALLOC_TEST_DEVICE=cuda $t 2>&1 | grep -E "test cases:"); echo "$(basename $t): $r"; done
echo "== seed example (recorded, analyzed) and PyTorch, same run"
$B/cachealloc-seed-example --snapshot /tmp/seed.bin; python3 docs/verification/seed_example_torch.py
$B/cachealloc-analyze /tmp/seed.bin | head -22
echo "== conformance on the cuda backend"; $B/cachealloc-conformance --device cuda testdata/conformance/*.csv
echo "== recording cost per pair, one thread (history off / on without stacks / with native stacks)"
taskset -c 3 $B/bench_history_overhead 500000 15
echo "== alloc+free pairs, T threads each on its own stream: cachealloc then PyTorch's allocator"
g++ -O2 -std=c++17 bench/torch_peer.cpp -I$T/include -L$T/lib -lc10_cuda -lc10 -I/usr/local/cuda/include \
    -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,$T/lib -o /tmp/torch_peer 2>&1 | tail -3
for n in 1 4 16; do CACHEALLOC_DEVICE=cuda $B/bench_threads $n 200000 off; /tmp/torch_peer $n 200000; done
CACHEALLOC_DEVICE=cuda $B/bench_threads 16 200000 none; CACHEALLOC_DEVICE=cuda $B/bench_threads 16 200000 native
echo "== PyTorch history cost (from Python)"; python3 bench/torch_history.py
echo "== bytes per event"; $B/bench_snapshot_size 1000000
echo "== analyzer throughput"
$B/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o /tmp/s3m.bin
taskset -c 4-8 $B/bench_analyze_throughput /tmp/s3m.bin 2>&1 | tail -15  # 5 cores: the analysis on one, blocks decoded ahead on 4
echo "== pluggable allocator example"; python3 examples/pytorch_pluggable.py build-h200/lib/libcachealloc.so $B/cachealloc-analyze 2>&1 | grep -v "^  " | head -40
echo "== _memory_viz on a converted snapshot"
$B/cachealloc-analyze convert pytorch_pluggable.bin -o /tmp/pluggable.pickle && echo converted
python3 -W ignore -m torch.cuda._memory_viz stats /tmp/pluggable.pickle 2>&1 | grep -v "^ \|^$" | head -20; echo "stats exit: ${PIPESTATUS[0]}"
python3 -W ignore -m torch.cuda._memory_viz trace /tmp/pluggable.pickle > /tmp/trace.txt 2>&1; echo "trace exit: $? ($(wc -l < /tmp/trace.txt) lines)"; head -8 /tmp/trace.txt
python3 -W ignore -m torch.cuda._memory_viz trace_plot /tmp/pluggable.pickle -o $OUT/pluggable_trace.html; echo "trace_plot exit: $?"
echo "== a 3M-event PyTorch pickle: Python's pickle.load against cachealloc-analyze, same run"
mkdir -p /tmp/big && python3 testdata/pytorch/make_snapshots.py /tmp/big big 1000000 && ls -la /tmp/big/big.pickle
if [ -f bench/pickle_vs_python.py ]; then python3 bench/pickle_vs_python.py /tmp/big/big.pickle $B/cachealloc-analyze; fi
echo done
