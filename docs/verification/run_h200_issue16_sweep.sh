#!/usr/bin/env bash
# Issue 16, items 2 and 3 on the H200 (docs/VERIFICATION.md, docs/PERFORMANCE.md):
# the fragmenting workload recorded from PyTorch 2.11, `recommend` at an 11 GiB
# cap, the whole `replay --sweep` ranking, the recommended setting run for
# real under that cap (its real peak reserved must equal the replayed one,
# and it must not run out of memory), and `--sweep` scaling with 1..16
# threads. Binaries built on the dev VM into build-h200/ (carry build-h200/bin
# and build-h200/syslib). Outputs under $OUT, the recorded pickle included
# (check it into testdata/pytorch/ so VERIFICATION's paragraph can be re-run).
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=build-h200/bin/cachealloc-analyze
W=docs/verification/issue16_fragmenting_workload.py
O=${OUT:-/tmp/issue16-sweep}; mkdir -p "$O"
CAP=$((11 * 1024 * 1024 * 1024))
unset PYTORCH_ALLOC_CONF PYTORCH_HIP_ALLOC_CONF
echo "== machine"; date -u; nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

echo "== 1. record under the default settings, no cap"
PYTORCH_CUDA_ALLOC_CONF= python3 $W record "$O/fragmenting.pickle" | tee "$O/recorded.json"

echo "== 2. recommend at the cap ($CAP bytes), then the whole ranking"
$B recommend "$O/fragmenting.pickle" --capacity $CAP | tee "$O/recommend.txt"
$B recommend "$O/fragmenting.pickle" --capacity $CAP --format json -o "$O/recommend.json" -f
$B replay "$O/fragmenting.pickle" --sweep --capacity $CAP --format csv -o "$O/sweep.csv" -f
head -6 "$O/sweep.csv"

echo "== 3. the recommended setting, for real at the cap"
# The setting as changes from the recorded (default) settings, in PyTorch's syntax
# (roundup_power2_divisions:4, not our canonical per-interval list).
CONF=$(python3 -c "import json; d=json.load(open('$O/recommend.json')); print(d['setting'] if d['helps'] else '')")
echo "PYTORCH_CUDA_ALLOC_CONF=$CONF"
PYTORCH_CUDA_ALLOC_CONF=$CONF python3 $W run $CAP | tee "$O/real_recommended.json"
python3 - "$O" <<'PY'
import json, sys
O = sys.argv[1]
rec = json.load(open(f"{O}/recommend.json"))
real = json.loads(open(f"{O}/real_recommended.json").read().strip().splitlines()[-1])
replayed = rec["best"]["peak_reserved"]
print(f"replayed peak reserved {replayed}, real {real['peak_reserved']}: {'EQUAL' if replayed == real['peak_reserved'] else 'DIFFER'}")
print(f"real run out of memory: {real['ooms'] > 0} (the replay said no)")
PY

echo "== 4. --sweep scaling: one grid, 1..16 threads (a 1M-event synthetic trace)"
build-h200/bin/cachealloc-synthetic --events 1000000 --seed 1 --stacks none -o "$O/s1m.bin" -f
build-h200/bin/bench_sweep_scaling "$O/s1m.bin" 0 1 2 4 8 16
rm -f "$O/s1m.bin"
