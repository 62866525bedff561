#!/usr/bin/env bash
# Session 5, first H200 call: (a) issue 15's comparison, PyTorch's
# `_memory_viz trace_plot` on a 3M-event PyTorch-shaped pickle (time and
# output size), and (b) for issue 17, the facts of the installed torch 2.11
# and its headers (the CUDAAllocator interface), brought back to build the
# extension against.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
echo "== machine"; date -u; nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== torch"
python3 - <<'PY'
import torch, os, sys, sysconfig
print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])
print("dir", os.path.dirname(torch.__file__))
print("cmake_prefix_path", torch.utils.cmake_prefix_path)
print("cxx11_abi", torch._C._GLIBCXX_USE_CXX11_ABI)
print("python include", sysconfig.get_paths()["include"], os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
import torch.utils.cpp_extension as ce
print("include_paths", ce.include_paths())
PY
T=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
ls $T/lib | head -50
python3 -c 'import pybind11' 2>&1 | tail -1
which ninja cmake g++ nvcc 2>&1
cp $T/include/c10/cuda/CUDACachingAllocator.h "$OUT/"
cp $T/include/c10/cuda/CUDAAllocatorConfig.h "$OUT/" 2>/dev/null
cp $T/include/torch/csrc/cuda/CUDAPluggableAllocator.h "$OUT/" 2>/dev/null
PYINC=$(python3 -c 'import sysconfig;print(sysconfig.get_paths()["include"])')
tar -C $T -cf - include share/cmake | xz -T16 -7 > /tmp/torch_include.tar.xz
[ -d "$PYINC" ] && tar -C $(dirname $PYINC) -cf - $(basename $PYINC) | xz -T16 -7 > "$OUT/python_include.tar.xz"
ls -la /tmp/torch_include.tar.xz
split -b 15M /tmp/torch_include.tar.xz "$OUT/torch_include.tar.xz."
echo "== issue 15: _memory_viz trace_plot on a 3M-event pickle"
python3 bench/pickle_vs_python.py /tmp/big3m.pickle build-h200/bin/cachealloc-analyze --make 1000000 --runs 1 2>&1 | tail -5
ls -la /tmp/big3m.pickle
/usr/bin/time -v python3 -m torch.cuda._memory_viz trace_plot /tmp/big3m.pickle -o /tmp/trace_plot.html 2>&1 | grep -E "Elapsed|Maximum resident|Exit" 
ls -la /tmp/trace_plot.html
head -c 600 /tmp/trace_plot.html | tr -d '\n' | cut -c1-600; echo
grep -o 'https\?://[^"'"'"' ]*' /tmp/trace_plot.html | sort -u | head
echo "== done"; date -u
