#!/usr/bin/env bash
# Session 3 on the H200 (docs/VERIFICATION.md): every suite on the cuda
# backend after the sanitizer and ground-truth changes, and the pickle
# reader's speed with exact block sizes. Binaries built here into build-h200/.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
# The test binaries hold absolute source paths (/work/main/...).
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=build-h200/bin
echo "== machine"; date -u; nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
echo "== every suite on the cuda backend"
for t in $B/tests/test_*; do r=$(CACHEALLOC_TEST_DEVICE=cuda timeout 300 $t 2>&1 | grep -E "test cases:|Status"); echo "$(basename $t): $r"; done
echo "== the ground-truth corpus read by the H200 build"
$B/tests/test_pytorch_ground_truth 2>&1 | tail -3
echo "== a 3M-event PyTorch pickle: Python's pickle.load against cachealloc-analyze, same run"
mkdir -p /tmp/big && python3 testdata/pytorch/make_snapshots.py /tmp/big big 1000000 > /dev/null && ls -la /tmp/big/big.pickle
python3 bench/pickle_vs_python.py /tmp/big/big.pickle $B/cachealloc-analyze --runs 3
$B/cachealloc-analyze /tmp/big/big.pickle --format json | python3 -c "import json,sys; d=json.load(sys.stdin); print('peak_allocated', d['peak_allocated'], 'reserved_at_end', d['reserved_at_end'], 'notes', d['notes'])"
cat /tmp/big/big.stats.json
echo done
