#!/usr/bin/env bash
# Session 12 on the H200, fourth call: is PyTorch's own run of a free-capped
# sequence the same every time? make_sequence.py (the script that made the
# CSVs) run again for seq1616 and seq1313, three times each, each run
# compared row by row with the CSV in testdata/conformance; then our replay
# of the same two, one process each, three rounds, with the note on the
# last refused cudaMalloc.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
C=build-h200/rel/cachealloc-conformance
echo "== machine"; date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
compare() {  # $1 our CSV, $2 PyTorch's new one
  python3 - "$1" "$2" <<'PY'
import csv, sys
a = list(csv.reader(open(sys.argv[1]))); b = list(csv.reader(open(sys.argv[2])))
for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
        print(f"  PyTorch's rerun differs from the CSV first at line {i + 1}: CSV {x[:5]}... rerun {y[:5]}...; device_free CSV {a[1][-1]} rerun {b[1][-1]}"); break
else:
    print(f"  PyTorch's rerun equals the CSV, all {len(a)} lines (device_free {b[1][-1]})")
PY
}
for r in 1 2 3; do
  for spec in "1616 1073741824 seq1616_default_free1024MiB" "1313 2147483648 seq1313_default_free2048MiB"; do
    set -- $spec
    mkdir -p /tmp/pt$r
    CONF_DEVICE_FREE=$2 python3 testdata/conformance/make_sequence.py /tmp/pt$r $1 4000 > /dev/null 2>&1
    echo "PyTorch run $r, $3:"; compare testdata/conformance/$3.csv /tmp/pt$r/$3.csv
  done
done
for r in 1 2 3; do
  for s in seq1616_default_free1024MiB seq1313_default_free2048MiB; do
    echo "ours, round $r, $s (a process of its own):"
    $C --device cuda testdata/conformance/$s.csv 2>&1 | grep -E "rows match|note:" | cut -c1-420
  done
done
echo "== done"; date -u
