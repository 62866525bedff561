#!/usr/bin/env bash
# Verification on the H200 (see docs/VERIFICATION.md). Expects binaries built
# here into build-h200/ and writes what it finds to $OUT.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
B=build-h200/bin
mkdir -p "$OUT/addresses" "$OUT/sequences"
echo "== machine"; date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
echo "== allocator suites on the cuda backend"
for t in $B/tests/test_allocator_*; do echo "-- $(basename $t)"; CACHEALLOC_TEST_DEVICE=cuda $t 2>&1 | tail -4; done
echo "== seed example: cachealloc then PyTorch, same machine, same run"
$B/cachealloc-seed-example
python3 docs/verification/seed_example_torch.py
echo "== our allocator on the cuda backend replaying PyTorch's sequences"
$B/cachealloc-conformance --device cuda --record-addresses "$OUT/addresses" testdata/conformance/*.csv
echo "== PyTorch re-runs of the six sequences with memory history: address traces"
cd testdata/conformance
run() { PYTORCH_CUDA_ALLOC_CONF="$1" CONF_FRACTION="$2" python3 trace_addresses.py "$OUT/sequences" "$3" 4000 2>&1 | tail -1; }
run "" 0 101; run "" 0.02 101; run "garbage_collection_threshold:0.6" 0.02 101
run "max_split_size_mb:64" 0 101; run "max_split_size_mb:64" 0.02 101; run "roundup_power2_divisions:4" 0 101
for f in seq101_*.csv; do cmp -s "$f" "$OUT/sequences/$f" && echo "$f: regenerated identically" || echo "$f: DIFFERS from the regenerated one"; done
echo "== new sequences"
run "" 0 202; run "roundup_power2_divisions:4" 0 303
run "max_split_size_mb:64,roundup_power2_divisions:4" 0.02 202
run "garbage_collection_threshold:0.6,max_split_size_mb:64" 0.02 303
run "roundup_power2_divisions:8" 0.02 404; run "garbage_collection_threshold:0.8" 0.01 505
cd "$OLDPWD"
echo "== our allocator on the cuda backend replaying the new sequences"
$B/cachealloc-conformance --device cuda "$OUT"/sequences/seq202_*.csv "$OUT"/sequences/seq303_*.csv "$OUT"/sequences/seq404_*.csv "$OUT"/sequences/seq505_*.csv
echo "== simulated replay with PyTorch's address traces"
$B/cachealloc-conformance "$OUT"/sequences/*.csv
(cd "$OUT" && tar czf results.tar.gz addresses sequences && rm -rf addresses sequences)
echo done
