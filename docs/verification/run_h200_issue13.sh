#!/usr/bin/env bash
# Issue 13 on the H200 (docs/VERIFICATION.md, "Issue 13: the driver address
# model"): new PyTorch sequences with seeds and configurations the driver
# address model never saw, two under a real memory limit on cudaMalloc;
# each replayed in the same run on the simulated device (the model, no
# address traces) and on the cuda device; the addresses of all three compared
# relative to their base; and cudaMalloc probed directly with sizes PyTorch
# never asks for, and under a real limit. Binaries built on the dev VM into
# build-h13-h200/. Everything made lands in $OUT/issue13.tar.gz.
set -u
export LD_LIBRARY_PATH=$PWD/build-h13-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
B=build-h13-h200/bin
W=/tmp/issue13; S=$W/sequences; rm -rf $W; mkdir -p $S $W/simulated $W/cuda $W/probes
start=$(date +%s)
echo "== machine"; date -u; nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
echo "== new sequences: PyTorch, with its memory history for the cudaMalloc addresses"
sequence() {  # SEED N_OPS CONF FRACTION DEVICE_FREE
  PYTORCH_CUDA_ALLOC_CONF="$3" CONF_FRACTION="$4" CONF_DEVICE_FREE="$5" \
    python3 testdata/conformance/trace_addresses.py $S "$1" "$2" 2>&1 | grep -v "^seq.* done"
}
sequence 606 4000 "" 0 0
sequence 707 4000 "max_split_size_mb:128" 0 0
sequence 808 4000 "roundup_power2_divisions:2" 0.03 0
sequence 909 4000 "garbage_collection_threshold:0.7,roundup_power2_divisions:4" 0.015 0
sequence 1010 4000 "max_split_size_mb:40,garbage_collection_threshold:0.5" 0.05 0
sequence 1111 4000 "" 0.005 0
sequence 1212 8000 "roundup_power2_divisions:8" 0 0
sequence 1313 4000 "" 0 $((2048 << 20))
sequence 1414 4000 "max_split_size_mb:64" 0 $((1536 << 20))
sequence 1515 4000 "expandable_segments:True,max_split_size_mb:128" 0.03 0
echo "(made in $(( $(date +%s) - start )) s)"
echo "== each replayed on the simulated device (driver address model, no traces), then on the cuda device"
for f in $S/*.csv; do
  $B/cachealloc-conformance --record-addresses $W/simulated "$f" | sed 's/^/simulated: /'
  $B/cachealloc-conformance --device cuda --record-addresses $W/cuda "$f" | sed 's/^/cuda:      /'
done
echo "== cudaMalloc addresses relative to the base: PyTorch's (reference) against the model's and our cuda device's"
for a in $S/*.addresses; do
  n=$(basename "$a")
  grep -q "^0x" "$a" || { echo "$n: no cudaMalloc (expandable segments)"; continue; }
  python3 testdata/conformance/compare_addresses.py "$a" "$W/simulated/$n" "$W/cuda/$n" | sed "s|$W/||"
done
echo "== cudaMalloc probed directly: sizes PyTorch never asks for, then under a real limit"
python3 testdata/driver/probe_cudamalloc.py $W/probes/probe_sizes_seed21.calls 21 1500
python3 testdata/driver/probe_cudamalloc.py $W/probes/probe_sizes_seed22.calls 22 1500
python3 testdata/driver/probe_cudamalloc.py $W/probes/probe_limit_seed23.calls 23 600 --device-free $((1024 << 20))
python3 testdata/driver/probe_cudamalloc.py $W/probes/probe_limit_seed24.calls 24 600 --device-free $((3000 << 20))
tar -C $W -czf $OUT/issue13.tar.gz .
echo "done in $(( $(date +%s) - start )) s"
