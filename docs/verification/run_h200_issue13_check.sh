#!/usr/bin/env bash
# Issue 13 on the H200, second run (docs/VERIFICATION.md, "Issue 13: the
# driver address model"): after the first run showed that cudaMalloc keeps
# about 2 MiB of the free memory back under a real limit, new sequences under
# such limits (seeds and settings not seen before) replayed on the simulated
# device and the cuda device in the same run; cudaMalloc probed with sizes of
# 2 MiB and more that are mostly not multiples of 2 MiB; and the limit's
# boundary measured directly. Binaries built on the dev VM into
# build-h13-h200/. Everything made lands in $OUT/issue13-check.tar.gz.
set -u
export LD_LIBRARY_PATH=$PWD/build-h13-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
B=build-h13-h200/bin
W=/tmp/issue13-check; S=$W/sequences; rm -rf $W; mkdir -p $S $W/simulated $W/cuda $W/probes
start=$(date +%s)
echo "== machine"; date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
echo "== new sequences under a real memory limit: PyTorch, with its memory history for the cudaMalloc addresses"
sequence() {  # SEED N_OPS CONF FRACTION DEVICE_FREE
  PYTORCH_CUDA_ALLOC_CONF="$3" CONF_FRACTION="$4" CONF_DEVICE_FREE="$5" \
    python3 testdata/conformance/trace_addresses.py $S "$1" "$2" 2>&1 | grep -v "^seq.* done"
}
sequence 1616 4000 "" 0 $((1024 << 20))
sequence 1717 4000 "roundup_power2_divisions:4" 0 $((2560 << 20))
sequence 1818 4000 "max_split_size_mb:128" 0 $((4096 << 20))
sequence 1919 4000 "garbage_collection_threshold:0.6" 0.02 $((2000 << 20))
echo "== each replayed on the simulated device (driver address model, no traces), then on the cuda device"
for f in $S/*.csv; do
  $B/cachealloc-conformance --record-addresses $W/simulated "$f" | sed 's/^/simulated: /'
  $B/cachealloc-conformance --device cuda --record-addresses $W/cuda "$f" | sed 's/^/cuda:      /'
done
echo "== cudaMalloc addresses relative to the base: PyTorch's (reference) against the model's and our cuda device's"
for a in $S/*.addresses; do
  n=$(basename "$a")
  python3 testdata/conformance/compare_addresses.py "$a" "$W/simulated/$n" "$W/cuda/$n" | sed "s|$W/||"
done
echo "== cudaMalloc probed directly: sizes of 2 MiB and more, then under a real limit"
python3 testdata/driver/probe_cudamalloc.py $W/probes/probe_sizes_seed31.calls 31 1500 --at-least $((2 << 20))
python3 testdata/driver/probe_cudamalloc.py $W/probes/probe_sizes_seed32.calls 32 1500 --at-least $((2 << 20))
python3 testdata/driver/probe_cudamalloc.py $W/probes/probe_limit_seed33.calls 33 600 --device-free $((2000 << 20))
echo "== how close to the free memory cudaMalloc succeeds"
python3 testdata/driver/probe_limit_boundary.py
tar -C $W -czf $OUT/issue13-check.tar.gz .
echo "done in $(( $(date +%s) - start )) s"
