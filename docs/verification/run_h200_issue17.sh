#!/usr/bin/env bash
# Issue 17 on the H200: the PyTorch extension (python/) built there against
# torch 2.11 (the libraries of our build-h200/ carried from the dev VM), then
# every torch.cuda memory API on PyTorch's allocator and on ours in separate
# processes (PyTorch's figures are the ground truth), a training run on both,
# and the speed of each.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
T=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
A=$PWD/build-h200/bin/cachealloc-analyze
echo "== build the extension"; date -u
time g++ -O2 -std=c++20 -shared -fPIC -fvisibility=hidden -D_GLIBCXX_USE_CXX11_ABI=1 \
  -isystem $T/include -isystem $T/include/torch/csrc/api/include -isystem /usr/local/cuda/include \
  -Irecorder/include -Isnapshot/include python/src/torch_allocator.cpp \
  build-h200/lib/libcachealloc_recorder.a build-h200/lib/libcachealloc_snapshot.a \
  -L$T/lib -lc10 -lc10_cuda -ltorch_cuda -ltorch_cpu -L/usr/local/cuda/lib64 -lcudart \
  $PWD/build-h200/syslib/libboost_stacktrace_backtrace.so.1.74.0 $PWD/build-h200/syslib/libzstd.so.1 -l:libz.so.1 -ldl -lpthread \
  -Wl,-rpath,$T/lib -Wl,-rpath,$PWD/build-h200/syslib -o python/cachealloc/libcachealloc_torch.so 2>&1 | grep -v "^$" | tail -20
ls -la python/cachealloc/libcachealloc_torch.so || exit 1
echo "== python/CMakeLists.txt with find_package(Torch) (docs/verification/issue17_cmake)"
PATH=/opt/torch/.venv/bin:$PATH cmake -S docs/verification/issue17_cmake -B /tmp/issue17_cmake -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython3_EXECUTABLE=$(which python3) 2>&1 | grep -E "cachealloc|Error|error" | head
PATH=/opt/torch/.venv/bin:$PATH cmake --build /tmp/issue17_cmake 2>&1 | tail -3
ls -la /tmp/issue17_cmake/lib/libcachealloc_torch.so python/cachealloc/libcachealloc_torch.so
echo "== pip install ./python (no network: no build isolation, no dependencies)"
pip install --no-build-isolation --no-deps --target /tmp/cachealloc-pip ./python 2>&1 | tail -2
PYTHONPATH=/tmp/cachealloc-pip python3 -c "
import cachealloc, cachealloc.torch, torch
cachealloc.torch.install()
x = torch.empty(1 << 20, device='cuda')
print('installed package: cachealloc from', cachealloc.__file__, '; memory_allocated', torch.cuda.memory_allocated())
"
cd python/tests
echo "== every API, PyTorch's allocator then ours"
python3 torch_api_probe.py --allocator pytorch --out $OUT/api_pytorch.json --analyzer $A 2>&1 | tail -30
python3 torch_api_probe.py --allocator cachealloc --out $OUT/api_cachealloc.json --analyzer $A 2>&1 | tail -30
python3 compare_torch_runs.py $OUT/api_pytorch.json $OUT/api_cachealloc.json 2>&1 | tail -40
echo "== training run, PyTorch's allocator then ours"
python3 torch_train_compare.py --allocator pytorch --out $OUT/train_pytorch.json 2>&1 | tail -5
python3 torch_train_compare.py --allocator cachealloc --out $OUT/train_cachealloc.json 2>&1 | tail -5
python3 compare_torch_runs.py $OUT/train_pytorch.json $OUT/train_cachealloc.json 2>&1 | tail -40
echo "== torch.compile(mode='reduce-overhead'), PyTorch's allocator then ours"
python3 torch_compile_compare.py --allocator pytorch --out $OUT/compile_pytorch.json 2>&1 | tail -3
python3 torch_compile_compare.py --allocator cachealloc --out $OUT/compile_cachealloc.json 2>&1 | tail -3
python3 - $OUT/compile_pytorch.json $OUT/compile_cachealloc.json <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = a["error"] is None and b["error"] is None and len(a["losses"]) == len(b["losses"]) and all(
    abs(x - y) <= 1e-3 * max(abs(x), 1e-9) for x, y in zip(a["losses"], b["losses"]))
print("torch.compile losses:", "EQUAL" if same else "DIFFERENT", a["losses"][-3:], b["losses"][-3:], b["error"] or "")
PY
cd ../..
echo "== speed: torch.empty/del from Python"
python3 bench/torch_extension_speed.py --allocator pytorch 2>&1 | tail -4
python3 bench/torch_extension_speed.py --allocator cachealloc 2>&1 | tail -4
echo "== speed: raw_alloc/raw_delete from C++ (bench/torch_peer.cpp)"
g++ -O2 -std=c++17 bench/torch_peer.cpp -isystem $T/include -L$T/lib -lc10_cuda -lc10 -isystem /usr/local/cuda/include \
  -L/usr/local/cuda/lib64 -lcudart -ldl -Wl,-rpath,$T/lib -o /tmp/torch_peer
for t in 1 16; do
  /tmp/torch_peer $t 200000
  CACHEALLOC_TORCH_LIBRARY=$PWD/python/cachealloc/libcachealloc_torch.so /tmp/torch_peer $t 200000
done
echo "== done"; date -u
