#!/usr/bin/env bash
# On a CUDA machine with torch 2.11: what PyTorch's empty_cache() gives back right after a
# dump (testdata/pytorch/make_snapshots.py records reserved_bytes_after_empty_cache), against
# the analyzer's "releasable by empty_cache" at the dump, for expandable segments and not
# (docs/VERIFICATION.md, "What empty_cache gives back"). Makes testdata/pytorch/empty_cache/.
#   B=build/bin OUT=/tmp/out bash testdata/pytorch/empty_cache/make_truth.sh   (pickles left in $OUT/empty_cache)
set -u
B=${B:-build/bin}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
O=${OUT:-/tmp}/empty_cache; mkdir -p $O
echo "== machine"; date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for conf in "expandable_segments:True" "expandable_segments:True,max_split_size_mb:64" "default"; do
  if [ $conf = default ]; then python3 testdata/pytorch/make_snapshots.py $O varlen
  else PYTORCH_CUDA_ALLOC_CONF=$conf python3 testdata/pytorch/make_snapshots.py $O varlen; fi
done
python3 testdata/pytorch/make_snapshots.py $O cnn
echo "== PyTorch's empty_cache() against the analyzer"
for p in $O/*.pickle; do
  python3 - "$p" "$B/cachealloc-analyze" <<'PY'
import json, subprocess, sys
p, analyze = sys.argv[1], sys.argv[2]
s = json.load(open(p[:-len('.pickle')] + '.stats.json'))
truth = s['reserved_bytes.all.current'] - s['reserved_bytes_after_empty_cache']
doc = json.loads(subprocess.run([analyze, 'fragmentation', p, '--format', 'json'],
                                check=True, capture_output=True, text=True).stdout)
ours = doc['releasable_by_empty_cache']
print(f"{p.split('/')[-1]}: reserved {s['reserved_bytes.all.current']}, PyTorch's empty_cache() gave back {truth}, "
      f"analyzer {ours}: {'equal' if ours == truth else 'DIFFERENT'}")
PY
done
echo "== done"; date -u
