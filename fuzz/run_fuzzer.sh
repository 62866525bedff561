#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SECONDS SEEDS CORPUS [RUNS [EXTRA...]]: runs FUZZER for
# SECONDS (or RUNS executions when given, -1: no limit) from the seeds under
# SEEDS (folders separated by ':'), in a fresh CORPUS folder, with the options
# of fuzz/NAME.options (max_len, timeout, rss_limit_mb); EXTRA are passed on.
# Fails on any crash, leak, timeout or out-of-memory result.
#
# Seeds: every file of SEEDS that the target reads (our format's .bin for
# fuzz_snapshot_reader, .pickle for fuzz_pickle_reader, both for
# every other target) and that fits in max_len. Larger files stay out:
# libFuzzer would cut them to max_len, and as seeds of their own size they
# made every mutation of them as large (docs/RELIABILITY.md, "Fuzzing").
# fuzz_diff reads two recordings from one input: its seeds are the files of
# up to half its max_len, each alone (compared with itself) and each paired
# with the next one, parted as fuzz_diff.cpp expects.
set -euo pipefail
fuzzer=$1 seconds=$2 seeds=$3 corpus=$4 runs=${5:--1}
shift $(( $# < 5 ? $# : 5 ))
name=$(basename "$fuzzer")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
options=()
max_len=4096
if [[ -f "$here/$name.options" ]]; then
  while IFS='=' read -r key value; do
    key=${key//[[:space:]]/} value=${value//[[:space:]]/}
    [[ -z "$key" || "$key" == \#* || "$key" == \[* ]] && continue
    options+=("-$key=$value")
    [[ "$key" == max_len ]] && max_len=$value
  done < "$here/$name.options"
fi
case "$name" in
  fuzz_snapshot_reader) patterns=(-name '*.bin') ;;
  fuzz_pickle_reader) patterns=(-name '*.pickle') ;;
  *) patterns=(-name '*.bin' -o -name '*.pickle') ;;
esac
rm -rf "$corpus" && mkdir -p "$corpus"
# One folder of seeds (libFuzzer reads folders one level deep).
seed_dir="$corpus.seeds"
rm -rf "$seed_dir" && mkdir -p "$seed_dir"
IFS=':' read -r -a seed_roots <<< "$seeds"
seed_max=$max_len
[[ "$name" == fuzz_diff ]] && seed_max=$((max_len / 2))
find "${seed_roots[@]}" -type f \( "${patterns[@]}" \) -size -"$((seed_max + 1))"c -print0 |
  while IFS= read -r -d '' file; do
    cp "$file" "$seed_dir/$(md5sum < "$file" | cut -c1-16)"
  done
if [[ "$name" == fuzz_diff ]]; then
  singles=("$seed_dir"/*)
  for ((i = 0; i + 1 < ${#singles[@]}; i++)); do
    pair="$seed_dir/pair-$i"
    { cat "${singles[i]}"; printf '\n--cachealloc-fuzz-diff-B--\n'; cat "${singles[i + 1]}"; } > "$pair"
  done
fi
exec "$fuzzer" -max_total_time="$seconds" -runs="$runs" "${options[@]}" -print_final_stats=1 \
  -artifact_prefix="$corpus/" "$@" "$corpus" "$seed_dir"
