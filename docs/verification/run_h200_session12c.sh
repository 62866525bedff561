#!/usr/bin/env bash
# Session 12 on the H200, third call: is the cuda device's conformance
# flakiness a matter of one process replaying many sequences? The four
# free-capped sequences that diverge, each replayed in a process of its own
# (8 rounds), against all 31 in one process (3 rounds), alternating.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
C=build-h200/rel/cachealloc-conformance
CAPPED="seq1313_default_free2048MiB seq1414_max_split_size_mb_64_free1536MiB seq1616_default_free1024MiB seq1919_garbage_collection_threshold_0.6_fraction0.02_free2000MiB"
echo "== machine"; date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for r in 1 2 3 4 5 6 7 8; do
  line="round $r, one process per sequence:"
  for s in $CAPPED; do
    out=$($C --device cuda testdata/conformance/$s.csv 2>&1)
    if echo "$out" | grep -qE " ([0-9]+)/\1 rows match$"; then line="$line match"; else line="$line DIFF($(echo "$out" | grep -oE "[0-9]+/4000" | head -1))"; fi
  done
  echo "$line"
  if [ $r -le 3 ]; then
    $C --device cuda testdata/conformance/*.csv > /tmp/all$r.txt 2>&1
    echo "round $r, all 31 in one process: $(grep -cE " ([0-9]+)/\1 rows match$" /tmp/all$r.txt) match"
  fi
done
echo "== done"; date -u
