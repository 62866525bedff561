#!/usr/bin/env bash
# The analyzer's reports end to end on one core: wall time, M events/s and
# peak RSS of summary, timeline (default buckets), check (a byte budget) and
# peak, of two builds in alternating rounds (the same machine, the same
# load), pinned to one CPU.
#
#   bench/report_speed.sh OLD_ANALYZE NEW_ANALYZE FILE [ROUNDS] [CPU]
#
# FILE: e.g. cachealloc-synthetic --stream --events 20000000 --seed 1 --stacks none -o FILE
set -eu
old=$1 new=$2 file=$3 rounds=${4:-3} cpu=${5:-0}
events=$(( $("$new" summary --format json "$file" | python3 -c "import json,sys; print(json.load(sys.stdin)[\"at_event\"])") + 1 ))
echo "file $file, $events events, CPU $cpu, $rounds rounds"
reports=("summary" "timeline" "check --max-peak-reserved 1TiB" "peak")
for round in $(seq 1 "$rounds"); do
  for r in "${reports[@]}"; do
    for build in old new; do
      bin=$old; [[ $build == new ]] && bin=$new
      # shellcheck disable=SC2086
      /usr/bin/time -f "%e %U %M" -o /tmp/report_speed.$$ taskset -c "$cpu" "$bin" $r "$file" >/dev/null || true
      read -r seconds user kib </tmp/report_speed.$$
      python3 -c "print(f'round $round  ${r%% *}  $build  {$seconds:.2f} s  {$events/$seconds/1e6 if $seconds else 0:.1f} M events/s  {$kib/1024:.1f} MiB  (user {$user:.2f} s)')"
    done
  done
done
rm -f /tmp/report_speed.$$
