#!/usr/bin/env bash
# Expandable segments on the H200: PyTorch sequences with expandable_segments:True,
# replayed by our allocator on the cuda backend and on the simulated device.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
B=build-h200/bin
mkdir -p "$OUT/sequences"
date -u
for t in test_allocator_expandable test_allocator_random; do echo "-- $t on cuda"; CACHEALLOC_TEST_DEVICE=cuda $B/tests/$t 2>&1 | tail -3; done
cd testdata/conformance
run() { PYTORCH_CUDA_ALLOC_CONF="$1" CONF_FRACTION="$2" python3 trace_addresses.py "$OUT/sequences" "$3" 4000 2>&1 | tail -1; }
run "expandable_segments:True" 0 101
run "expandable_segments:True" 0.02 101
run "expandable_segments:True,max_split_size_mb:64" 0.02 202
run "expandable_segments:True,garbage_collection_threshold:0.6" 0.02 303
run "expandable_segments:True,roundup_power2_divisions:4" 0 404
cd "$OLDPWD"
echo "== cuda backend"; $B/cachealloc-conformance --device cuda "$OUT"/sequences/*.csv
echo "== simulated"; $B/cachealloc-conformance "$OUT"/sequences/*.csv
(cd "$OUT" && tar czf expandable.tar.gz sequences && rm -rf sequences)
