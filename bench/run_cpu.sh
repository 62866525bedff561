#!/usr/bin/env bash
# The figures of docs/PERFORMANCE.md, "On a 2-core x86 machine", on any x86-64
# Linux machine: no GPU and no torch needed, Python 3 only. The allocator runs
# on the simulated device; its cached path never calls the device, so those
# figures are the allocator's own.
#
# Usage, from the repository root, after a Release build, with nothing else
# running on the machine:
#   cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=Release && cmake --build build-rel
#   bash bench/run_cpu.sh                        # rows 1-5
#   PART=analyzer bash bench/run_cpu.sh          # one part: analyzer|pickles|dump|allocator|more
#   PART=more bash bench/run_cpu.sh              # row 6, the commands measured once
#   PART=compare BASE=../before/build-rel/bin bash bench/run_cpu.sh
#                                                # B against BASE, alternating (bench/compare_builds.sh)
#   BASE=../before/build-rel/bin BASE_LABEL=before bash bench/run_cpu.sh
#                                                # every row also with other binaries, rounds alternating
#
# Environment (defaults in brackets):
#   B           the Release binaries measured [build-rel/bin]
#   BASE        a folder of baseline binaries, run beside B in the same rounds;
#               their lines start with BASE_LABEL [none]
#   BASE_LABEL  [base]
#   ROUNDS      rounds of each figure [3]
#   CPU         the CPU the pinned rows run on [1]
#   PART        all | analyzer | pickles | dump | allocator | more [all: rows 1-5]
#   WORK        scratch folder for the large files [/tmp/cachealloc-bench]
#
# What each row prints, and its row in docs/PERFORMANCE.md:
#   1  analyzer: a 3M-event cachealloc-synthetic file (native stacks, format
#      6) through bench_analyze_throughput FILE 1 NPROC: the whole job on one
#      core, with decoding on another, in ranges on every core, loading
#      everything first, decode alone (PEXT and the portable merge), analysis
#      alone, and the peak RSS of each path; then the one-core job pinned to
#      each CPU in turn, twice: "analyzer, ...", "decode ...", "peak RSS".
#   2  pickles: a PyTorch-shaped pickle of 1M allocations (3M trace entries,
#      made once by bench/pickle_vs_python.py --make), `cachealloc-analyze
#      summary` against Python's pickle.load, best of 3; then pickles our own
#      `convert` writes from 1M, 3M and 5M events: "PyTorch-shaped 3M-entry
#      pickle", "pickles of our own convert".
#   3  dump: 1M events from 10k distinct native stacks, symbolization
#      included, twice (bench_dump_time 1000000 10000): "dump of 1M events".
#   4  allocator: the cached 4 KiB pair pinned, with history off, on, with
#      native stacks and the coarse clock (bench_history_overhead 500000 9),
#      and the mixed workload (bench_mixed 1000000 5 off), pinned to CPU:
#      "cached 4 KiB pair", "mixed workload".
#   5  the machine: one clock read inside a critical section
#      (bench_clock_read 5000000 5) and the first touch of a page, small and
#      huge (bench_page_faults 256 3): "What limits the figures".
#   6  (PART=more) one what-if replay on one core (bench_replay_throughput on
#      3M events without stacks), the setting sweep over 1M events on 1, 2,
#      4... threads (bench_sweep_scaling), `ranks` over 64 files of 200k
#      events (bench_ranks_scaling), bytes per event
#      (bench_snapshot_size 1000000) and the replay with 12.5k to 100k frees
#      waiting for other streams (bench_waiting_frees 100000): "Figures
#      measured once".
set -u
PART=${PART:-all}
B=${B:-build-rel/bin}
BASE=${BASE:-}
BASE_LABEL=${BASE_LABEL:-base}
ROUNDS=${ROUNDS:-3}
CPU=${CPU:-1}
WORK=${WORK:-/tmp/cachealloc-bench}
case "$PART" in all|analyzer|pickles|dump|allocator|more) ;;
  compare) CACHEALLOC_DEVICE=simulated exec bash bench/compare_builds.sh ;;
  *) echo "PART must be all, analyzer, pickles, dump, allocator, more or compare" >&2; exit 2 ;; esac
for f in cachealloc-synthetic cachealloc-analyze bench_analyze_throughput bench_dump_time bench_history_overhead \
         bench_mixed bench_clock_read bench_page_faults; do
  [ -x "$B/$f" ] || { echo "missing $B/$f: build Release into $(dirname "$B") first" >&2; exit 2; }
done
export CACHEALLOC_DEVICE=simulated
mkdir -p "$WORK"
part() { [ "$PART" = all ] && [ "$1" != more ] || [ "$PART" = "$1" ]; }

# run NAME ARGS...: B's NAME, then BASE's beside it (its lines prefixed), each
# with $PIN in front when set (PIN="taskset -c 1" run ...).
run() {
  local name=$1; shift
  ${PIN:-} "$B/$name" "$@"
  [ -z "$BASE" ] || ${PIN:-} "$BASE/$name" "$@" 2>&1 | sed "s|^|$BASE_LABEL: |"
}

echo "== machine"; date -u; nproc; grep -m1 "model name" /proc/cpuinfo; uptime

if part analyzer; then
  echo "== 1. analyzer, 3M events: one core, decoding on another, ranges on every core ($ROUNDS rounds)"
  S=$WORK/s3m.bin
  "$B/cachealloc-synthetic" --events 3000000 --seed 1 --stacks native --threads 1 -f -o "$S"
  for r in $(seq "$ROUNDS"); do echo "-- round $r"; run bench_analyze_throughput "$S" 1 "$(nproc)"; done
  echo "-- the one-core job pinned to each CPU (best of 3 each), twice"
  for r in 1 2; do for c in $(seq 0 $(($(nproc) - 1))); do
    echo "cpu $c: $(PIN="taskset -c $c" run bench_analyze_throughput --one-core "$S")"
  done; done
fi

if part pickles; then
  echo "== 2. PyTorch-shaped pickle, 1M allocations (3M trace entries): summary against pickle.load"
  P=$WORK/pytorch_shaped.pickle
  [ -f "$P" ] || python3 bench/pickle_vs_python.py "$P" "$B/cachealloc-analyze" --make 1000000 --runs 1 >/dev/null
  python3 bench/pickle_vs_python.py "$P" "$B/cachealloc-analyze" --runs 3
  [ -z "$BASE" ] || python3 bench/pickle_vs_python.py "$P" "$BASE/cachealloc-analyze" --runs 3 | sed "s|^|$BASE_LABEL: |"
  echo "-- pickles of our own convert, 1M / 3M / 5M events"
  python3 bench/pickle_vs_python.py "$WORK/ours" "$B/cachealloc-analyze" --convert 1000000 3000000 5000000
fi

if part dump; then
  echo "== 3. dump: 1M events, 10k distinct native stacks (2 rounds)"
  for r in 1 2; do run bench_dump_time 1000000 10000; done
fi

if part allocator; then
  echo "== 4. allocator on the simulated device, pinned to CPU $CPU ($ROUNDS rounds)"
  for r in $(seq "$ROUNDS"); do
    echo "-- round $r"
    PIN="taskset -c $CPU" run bench_history_overhead 500000 9
    PIN="taskset -c $CPU" run bench_mixed 1000000 5 off
  done
  echo "== 5. the machine: a clock read inside a critical section; the first touch of a page"
  taskset -c "$CPU" "$B/bench_clock_read" 5000000 5
  "$B/bench_page_faults" 256 3
fi

if part more; then
  echo "== 6. what-if replay, sweep, ranks, bytes per event"
  for f in bench_replay_throughput bench_sweep_scaling bench_ranks_scaling bench_snapshot_size bench_waiting_frees; do
    [ -x "$B/$f" ] || { echo "missing $B/$f" >&2; exit 2; }
  done
  "$B/cachealloc-synthetic" --events 3000000 --seed 1 --stacks none -f -o "$WORK/s3m_nostacks.bin"
  PIN="taskset -c $CPU" run bench_replay_throughput "$WORK/s3m_nostacks.bin" 3
  "$B/cachealloc-synthetic" --events 1000000 --seed 1 --stacks none -f -o "$WORK/s1m.bin"
  run bench_sweep_scaling "$WORK/s1m.bin" 0
  run bench_ranks_scaling --dir "$WORK/ranks64" --files 64
  run bench_snapshot_size 1000000
  PIN="taskset -c $CPU" run bench_waiting_frees 100000
fi
echo "== done"; date -u; uptime
