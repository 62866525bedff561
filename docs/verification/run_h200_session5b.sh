#!/usr/bin/env bash
# Session 5, second H200 call: issue 17's probe again on our allocator (with
# Python's fault handler: the first run of this session's last binaries wrote
# nothing), then issue 16's and issue 15's checks.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
[ -x build-h200/bin/cachealloc-analyze ] || tar -C build-h200 -xzf build-h200/carry.tgz
T=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
A=$PWD/build-h200/bin/cachealloc-analyze
echo "== build the extension"; date -u
g++ -O2 -std=c++20 -shared -fPIC -fvisibility=hidden -D_GLIBCXX_USE_CXX11_ABI=1 \
  -isystem $T/include -isystem $T/include/torch/csrc/api/include -isystem /usr/local/cuda/include \
  -Irecorder/include -Isnapshot/include python/src/torch_allocator.cpp \
  build-h200/lib/libcachealloc_recorder.a build-h200/lib/libcachealloc_snapshot.a \
  -L$T/lib -lc10 -lc10_cuda -ltorch_cuda -ltorch_cpu -L/usr/local/cuda/lib64 -lcudart \
  $PWD/build-h200/syslib/libboost_stacktrace_backtrace.so.1.74.0 $PWD/build-h200/syslib/libzstd.so.1 -l:libz.so.1 -ldl -lpthread \
  -Wl,-rpath,$T/lib -Wl,-rpath,$PWD/build-h200/syslib -o python/cachealloc/libcachealloc_torch.so || exit 1
(
cd python/tests
echo "== probe: ours (fault handler on), then PyTorch's, compared"
timeout 300 python3 -X faulthandler torch_api_probe.py --allocator cachealloc --out $OUT/api_cachealloc.json --analyzer $A 2>&1 | tail -45
echo "probe exit: ${PIPESTATUS[0]}"
python3 torch_api_probe.py --allocator pytorch --out $OUT/api_pytorch.json --analyzer $A 2>&1 | grep -E "^FAIL" 
python3 compare_torch_runs.py $OUT/api_pytorch.json $OUT/api_cachealloc.json 2>&1 | tail -20
)
echo "== speed from Python with history (ours: native stacks through torch's API)"
python3 bench/torch_extension_speed.py --allocator pytorch 2>&1 | tail -3
python3 bench/torch_extension_speed.py --allocator cachealloc 2>&1 | tail -3
echo "== issue 16"; date -u
OUT=$OUT/i16 timeout 240 bash docs/verification/run_h200_issue16.sh 2>&1 | tail -45
echo "== issue 15"; date -u
RUNS=1 OUT=$OUT/i15 timeout 150 bash docs/verification/run_h200_issue15.sh 2>&1 | tail -14
echo "== done"; date -u
