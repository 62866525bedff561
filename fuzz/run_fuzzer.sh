#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SECONDS SEEDS CORPUS [RUNS]: runs FUZZER for SECONDS
# (or RUNS executions when given) from every file under SEEDS, in a fresh
# CORPUS folder. Fails on any crash, leak, timeout or out-of-memory result.
set -euo pipefail
fuzzer=$1 seconds=$2 seeds=$3 corpus=$4 runs=${5:--1}
rm -rf "$corpus" && mkdir -p "$corpus"
# One folder of seeds: every regular file of testdata/ up to 4 MB (libFuzzer
# reads folders one level deep).
seed_dir="$corpus.seeds"
rm -rf "$seed_dir" && mkdir -p "$seed_dir"
find "$seeds" -type f -size -4M -print0 | while IFS= read -r -d '' file; do
  cp "$file" "$seed_dir/$(printf '%s' "$file" | md5sum | cut -c1-16)"
done
exec "$fuzzer" -max_total_time="$seconds" -runs="$runs" -timeout=10 -rss_limit_mb=2048 -max_len=1048576 \
  -print_final_stats=1 -artifact_prefix="$corpus/" "$corpus" "$seed_dir"
