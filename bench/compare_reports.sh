#!/usr/bin/env bash
# Compares two builds' reports, byte for byte, over every snapshot in
# testdata/ (and any extra files given): summary, timeline, peak, check,
# segments --at, fragmentation, timeline's rows of a few and of one event,
# summary and timeline of a window, in table and json. Prints one line per
# difference and the counts; exit 1 when any differ.
#
#   bench/compare_reports.sh OLD_ANALYZE NEW_ANALYZE [EXTRA_FILE...]
set -u
old=$1 new=$2
shift 2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mapfile -t files < <(find testdata -type f \( -name '*.bin' -o -name '*.pickle' -o -name '*.zst' -o -name '*.gz' \) | sort)
files+=("$@")
reports=("summary" "timeline" "peak" "check --max-peak-reserved 1GiB --max-category activation=1MiB"
         "segments --at 100" "fragmentation" "timeline --buckets 7" "timeline --buckets 1000000"
         "summary --from 5" "timeline --to 200")
same=0 differ=0
for f in "${files[@]}"; do
  for r in "${reports[@]}"; do
    for fmt in table json; do
      # shellcheck disable=SC2086
      "$old" $r --format "$fmt" "$f" >"$out/old" 2>&1; o=$?
      # shellcheck disable=SC2086
      "$new" $r --format "$fmt" "$f" >"$out/new" 2>&1; n=$?
      if [[ $o == "$n" ]] && cmp -s "$out/old" "$out/new"; then
        same=$((same + 1))
      else
        differ=$((differ + 1))
        echo "DIFFER: $r --format $fmt $f (exit $o against $n)"
      fi
    done
  done
done
echo "$same same, $differ differ"
[[ $differ == 0 ]]
