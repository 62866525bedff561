#!/usr/bin/env bash
# Session 7, issue 18 "Fuzzing": the three libFuzzer targets to >= 10M
# executions each, in parallel on the H200 host's 16 cores, under one device
# call (< 10 min). Run from the repository root on the device:
#   tar xzf build-h18f/fuzz-carry.tgz -C build-h18f && bash docs/verification/run_h200_fuzz_session7.sh
# build-h18f/fuzz-carry.tgz (made on the dev VM by `bash
# docs/verification/run_h200_fuzz_session7.sh --pack`) holds the fuzz binaries
# built there (clang 14, ASan+UBSan, static sanitizer runtimes), syslib/ with
# the shared libraries Ubuntu 24.04 lacks, and one seed folder per target.
#
# Each target runs as libFuzzer -jobs=W -workers=W: W processes, each with
# -runs=ceil(TOTAL/W) (-runs counts per job) and -max_total_time=SECONDS as a
# cap, sharing one corpus folder. The count reported is libFuzzer's own: the
# sum over the jobs' logs of stat::number_of_executed_units
# (-print_final_stats=1). Findings: every crash-/leak-/timeout-/oom-/slow-unit
# file under the artifact folder, and every job that did not exit 0.
# Environment (defaults in brackets): TARGETS [all three] the targets of this
# call; TOTAL [10000000] executions per target; FUZZ_SECONDS [450] cap per
# job; W_SNAPSHOT [3], W_PICKLE [5], W_ANALYSIS [8] workers; OUT [./fuzz-out]
# for the logs and artifacts.
# At the rates measured on the dev VM (docs/RELIABILITY.md: 5,746, 4,317 and
# 1,287 executions per CPU second) 10M of each is 11,800 core seconds, more
# than one call's 10 minutes on 16 cores, so it takes two calls:
#   TARGETS="fuzz_snapshot_reader fuzz_pickle_reader" W_SNAPSHOT=7 W_PICKLE=9 FUZZ_SECONDS=400
#   TARGETS=fuzz_analysis W_ANALYSIS=16 FUZZ_SECONDS=520
# (about 250 s and 490 s at those rates; a job stops at its -runs share first).
set -uo pipefail
root=$(pwd)
carry=$root/build-h18f/fuzz-carry
targets=(fuzz_snapshot_reader fuzz_pickle_reader fuzz_analysis)

# --pack (dev VM): the tarball to carry, from build-h18f.
if [[ "${1:-}" == --pack ]]; then
  set -e
  rm -rf "$carry" && mkdir -p "$carry/bin" "$carry/syslib" "$carry/seeds"
  for t in "${targets[@]}"; do
    cp "$root/build-h18f/bin/$t" "$carry/bin/"
    # The seeds run_fuzzer.sh picks (same rules), without running the target.
    scratch=$(mktemp -d)
    ln -s /bin/true "$scratch/$t"
    "$root/fuzz/run_fuzzer.sh" "$scratch/$t" 1 "$root/testdata:$root/analyzer/testdata" "$scratch/c" >/dev/null
    mv "$scratch/c.seeds" "$carry/seeds/$t"
    rm -rf "$scratch"
  done
  # Every shared library but glibc's and the compiler's (Ubuntu 24.04 has newer ones).
  ldd "$carry"/bin/* | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
      *) cp -L "$lib" "$carry/syslib/" ;;
    esac
  done
  tar czf "$root/build-h18f/fuzz-carry.tgz" -C "$root/build-h18f" fuzz-carry
  ls -la "$root/build-h18f/fuzz-carry.tgz"; ls "$carry/syslib"
  for t in "${targets[@]}"; do echo "$t: $(ls "$carry/seeds/$t" | wc -l) seeds"; done
  exit 0
fi

# TARGETS: the targets to run this call (all three by default; see below).
read -r -a targets <<< "${TARGETS:-${targets[*]}}"
TOTAL=${TOTAL:-10000000}
SECONDS_CAP=${FUZZ_SECONDS:-450}
OUT=${OUT:-$root/fuzz-out}
declare -A workers=([fuzz_snapshot_reader]=${W_SNAPSHOT:-3} [fuzz_pickle_reader]=${W_PICKLE:-5}
                    [fuzz_analysis]=${W_ANALYSIS:-8})
[[ -d "$carry" ]] || tar xzf "$root/build-h18f/fuzz-carry.tgz" -C "$root/build-h18f"
export LD_LIBRARY_PATH="$carry/syslib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$OUT"
{ echo "host $(hostname), $(nproc) cores, $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "TOTAL=$TOTAL per target, job cap ${SECONDS_CAP}s, workers: snapshot ${workers[fuzz_snapshot_reader]}," \
       "pickle ${workers[fuzz_pickle_reader]}, analysis ${workers[fuzz_analysis]}"; } | tee "$OUT/summary.txt"

# Options of fuzz/NAME.options as -key=value.
options_of() {
  sed -n 's/^[[:space:]]*\([a-z_]*\)[[:space:]]*=[[:space:]]*\([^[:space:]]*\).*/-\1=\2/p' "$root/fuzz/$1.options"
}

# clang 14's ASan runtime can fail at start under 32 bits of mmap randomness
# (Ubuntu 24.04's kernels; vm.mmap_rnd_bits is 28 on the dev VM): the jobs run
# without address randomization, which they inherit from setarch -R.
no_aslr=()
if [[ "$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)" -gt 28 ]] && command -v setarch > /dev/null; then
  no_aslr=(setarch "$(uname -m)" -R)
fi
echo "vm.mmap_rnd_bits $(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null), prefix: ${no_aslr[*]:-none}" | tee -a "$OUT/summary.txt"

start=$(date +%s)
for t in "${targets[@]}"; do
  w=${workers[$t]}
  runs=$(( (TOTAL + w - 1) / w ))
  dir="$OUT/$t"; corpus=/tmp/fuzz-corpus-$t
  rm -rf "$dir" "$corpus" && mkdir -p "$dir/artifacts" "$corpus"
  # -jobs writes fuzz-JOB.log into the current folder.
  ( began=$(date +%s)
    cd "$dir" && "${no_aslr[@]}" "$carry/bin/$t" $(options_of "$t") -jobs="$w" -workers="$w" -runs="$runs" \
      -max_total_time="$SECONDS_CAP" -print_final_stats=1 -artifact_prefix="$dir/artifacts/" \
      "$corpus" "$carry/seeds/$t" > "$dir/parent.log" 2>&1
    echo $(( $(date +%s) - began )) > "$dir/elapsed" ) &
done
wait
end=$(date +%s)

status=0
for t in "${targets[@]}"; do
  dir="$OUT/$t"
  executions=$(cat "$dir"/fuzz-*.log 2>/dev/null | awk '/^stat::number_of_executed_units:/ {s += $2} END {print s + 0}')
  jobs_done=$(grep -c '^stat::number_of_executed_units:' "$dir"/fuzz-*.log 2>/dev/null | awk -F: '{s += $NF} END {print s + 0}')
  slowest=$(cat "$dir"/fuzz-*.log 2>/dev/null | awk '/^stat::slowest_unit_time_sec:/ {if ($2 > m) m = $2} END {print m + 0}')
  rss=$(cat "$dir"/fuzz-*.log 2>/dev/null | awk '/^stat::peak_rss_mb:/ {if ($2 > m) m = $2} END {print m + 0}')
  count() { find "$dir/artifacts" -name "$1-*" | wc -l; }
  crashes=$(count crash) leaks=$(count leak) timeouts=$(count timeout) ooms=$(count oom)
  failed_jobs=$(grep -ac 'exited with exit code [1-9]' "$dir/parent.log")
  elapsed=$(cat "$dir/elapsed" 2>/dev/null || echo $(( end - start )))
  rate=$(( executions / ( elapsed > 0 ? elapsed : 1 ) ))
  line="$t: executions $executions (libFuzzer's stat::number_of_executed_units over $jobs_done of ${workers[$t]} jobs), wall $elapsed s on ${workers[$t]} cores, $rate exec/s, findings: crashes $crashes leaks $leaks timeouts $timeouts ooms $ooms, jobs failed $failed_jobs, slowest unit ${slowest} s, peak RSS ${rss} MB"
  echo "$line" | tee -a "$OUT/summary.txt"
  (( executions >= TOTAL && crashes + leaks + timeouts + ooms + failed_jobs == 0 )) || status=1
done
echo "all targets of this call (${targets[*]}): $(( end - start )) s wall" | tee -a "$OUT/summary.txt"
rm -rf /tmp/fuzz-corpus-*
exit $status
