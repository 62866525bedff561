#!/usr/bin/env bash
# Benchmarks and PyTorch interop on the H200 (docs/PERFORMANCE.md, docs/VERIFICATION.md).
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
B=build-h200/bin
T=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
echo "== machine"; date -u; nproc; lscpu | grep -E "Model name|MHz" | head -2; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== every suite on the cuda backend"
for t in $B/tests/test_*; do r=$(CACHEALLOC_TEST_DEVICE=cuda $t 2>&1 | grep -E "test cases:"); echo "$(basename $t): $r"; done
echo "== recording cost per pair (one thread)"; taskset -c 2 $B/bench_history_overhead 500000 15
echo "== threads, each on its own stream: cachealloc"
for n in 1 16; do CACHEALLOC_DEVICE=cuda $B/bench_threads $n 200000 off; done
CACHEALLOC_DEVICE=cuda $B/bench_threads 16 200000 none; CACHEALLOC_DEVICE=cuda $B/bench_threads 16 200000 native
echo "== threads, each on its own stream: PyTorch's allocator, same machine, same run"
g++ -O2 -std=c++17 bench/torch_peer.cpp -I$T/include -L$T/lib -lc10_cuda -lc10 -I/usr/local/cuda/include \
    -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,$T/lib -o /tmp/torch_peer 2>&1 | tail -3
for n in 1 16; do /tmp/torch_peer $n 200000; done
echo "== PyTorch history cost from Python"; python3 bench/torch_history.py
echo "== bytes per event"; $B/bench_snapshot_size 1000000
echo "== analyzer: one pass over 3M events in memory"; $B/tests/test_analyzer_performance --no-skip 2>&1 | grep -E "analysis:|test cases"
$B/cachealloc-synthetic --events 3000000 --seed 1 --stacks native --threads 1 -o /tmp/s3m.bin
python3 - <<'PY'
import resource, subprocess, time
for cmd in (['build-h200/bin/cachealloc-analyze', 'summary', '/tmp/s3m.bin', '--format', 'json'],):
    t = time.perf_counter(); subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL); t = time.perf_counter() - t
    print(f"cachealloc-analyze summary on a 3M-event synthetic file: {t:.2f} s, {3e6 / t / 1e6:.1f} M events/s end to end, "
          f"peak RSS {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MiB")
PY
echo "== pluggable allocator example"; python3 examples/pytorch_pluggable.py build-h200/lib/libcachealloc.so $B/cachealloc-analyze 2>&1 | tail -25
echo "== _memory_viz on converted snapshots"
$B/cachealloc-analyze convert pytorch_pluggable.bin -o /tmp/pluggable.pickle && python3 -m torch.cuda._memory_viz stats /tmp/pluggable.pickle | tail -8
python3 -m torch.cuda._memory_viz trace /tmp/pluggable.pickle | head -5; python3 -m torch.cuda._memory_viz trace /tmp/pluggable.pickle | wc -l
$B/cachealloc-synthetic --events 200000 --seed 2 --stacks native --threads 1 -o /tmp/s200k.bin && $B/cachealloc-analyze convert /tmp/s200k.bin -o /tmp/s200k.pickle
python3 -m torch.cuda._memory_viz stats /tmp/s200k.pickle | tail -4; python3 -m torch.cuda._memory_viz trace /tmp/s200k.pickle | wc -l
python3 -m torch.cuda._memory_viz trace_plot /tmp/pluggable.pickle -o $OUT/pluggable_trace.html && ls -la $OUT/pluggable_trace.html
cp pytorch_pluggable.bin $OUT/ 2>/dev/null
echo "== a 3M-event PyTorch pickle: Python's pickle.load against cachealloc-analyze"
mkdir -p /tmp/big && (time python3 testdata/pytorch/make_snapshots.py /tmp/big big 1000000) 2>&1 | tail -3; ls -la /tmp/big
python3 - <<'PY'
import pickle, resource, subprocess, time
p = '/tmp/big/big.pickle'
t = time.perf_counter(); d = pickle.load(open(p, 'rb')); load = time.perf_counter() - t
n = sum(len(tr) for tr in d['device_traces']); del d
t = time.perf_counter(); subprocess.run(['build-h200/bin/cachealloc-analyze', 'summary', p], check=True, stdout=subprocess.DEVNULL); ours = time.perf_counter() - t
print(f"{n} trace events; python pickle.load: {load:.2f} s; cachealloc-analyze summary: {ours:.2f} s; ratio {ours / load:.3f}; "
      f"analyzer peak RSS {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MiB")
PY
echo done
