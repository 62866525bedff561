#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine (root or sudo):
#   ./dev.sh demo   install what is missing, build the two programs the demo
#                   runs (not the tests), run the main job
#   ./dev.sh test   install what is missing, build, run every test: the normal
#                   build, then the whole suite under ASan+UBSan, then the
#                   whole suite and the threaded benchmark under TSan, then the
#                   fuzzers briefly (what CI runs)
#   ./dev.sh asan   only the ASan+UBSan build and suite
#   ./dev.sh tsan   only the TSan build, the suite and the threaded benchmark
#   ./dev.sh fuzz   only the libFuzzer targets (clang, ASan+UBSan), each for
#                   FUZZ_SECONDS (default 30) from the seeds in testdata/
#   ./dev.sh build  install and build
# The cuda backend is built when a CUDA toolkit is found (CUDAToolkit_ROOT or
# /usr/local/cuda); without one everything else still builds and the demo runs
# on the simulated device.
set -euo pipefail
cd "$(dirname "$0")"
mode=${1:-demo}
case "$mode" in demo|test|build|asan|tsan|fuzz) ;; *) echo "usage: $0 demo|test|build|asan|tsan|fuzz" >&2; exit 2 ;; esac

packages=(cmake g++ make ninja-build libcereal-dev libcli11-dev libboost-stacktrace-dev doctest-dev python3 python3-dev
          zlib1g-dev libzstd-dev help2man chromium gzip clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# node and npm: the HTML report's uPlot and the browser test's puppeteer-core come
# from the npm registry at build time (analyzer/html, tests/browser). A node
# from elsewhere (NodeSource bundles npm) is used as it is.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

jobs=$(nproc 2>/dev/null || echo 2)

# cmake -S . -B DIR ARGS...: Ninja for a new build folder, the folder's own
# generator for an existing one.
configure() {
  local dir=$1; shift
  local generator=()
  [ -f "$dir/CMakeCache.txt" ] || generator=(-G Ninja)
  cmake -S . -B "$dir" "${generator[@]}" "$@"
}

# The normal build (build/): what users run. With target names, only those
# (and what they need) are built.
normal_build() {
  configure build -DCMAKE_BUILD_TYPE=RelWithDebInfo
  cmake --build build -j"$jobs" ${1:+--target "$@"}
}

# The sanitizer builds keep line tables only (-g1), enough for their reports.
# TSan compiles at -O1, the half of -O2 -g's compile time that lets CI run the
# whole suite under it within its 90 minutes on 2 cores. ASan+UBSan stays at
# -O2: at -O1 little is inlined, and with detect_stack_use_after_return every
# small call takes a fake stack frame (88% of test_snapshot_format's time,
# which ran past 14 minutes instead of 2).
asan_opt="-O2 -g1 -DNDEBUG"
tsan_opt="-O1 -g1 -DNDEBUG"

# ASan+UBSan (build-asan/): the whole suite, every error fatal, leaks too.
asan() {
  local flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
  configure build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$asan_opt" \
    -DCACHEALLOC_BUILD_BENCH=OFF -DCACHEALLOC_BROWSER_TESTS=OFF -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined"
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs"
}

# TSan (build-tsan/): the whole suite, then the threaded benchmark with
# history off, on without stacks and on with native stacks. Any report fails
# the run (halt_on_error); tsan.supp holds the proven-benign ones. Suites that
# size their work to the build (test_history_stress, the CLI's memory caps) use
# their sanitizer sizes.
tsan() {
  configure build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$tsan_opt" \
    -DCACHEALLOC_BROWSER_TESTS=OFF -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread"
  cmake --build build-tsan -j"$jobs"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
  ctest --test-dir build-tsan --output-on-failure -j"$jobs"
  for threads in 8 16; do
    for history in off none native; do
      ./build-tsan/bin/bench_threads "$threads" 2000 "$history"
    done
  done
}

# libFuzzer (build-fuzz/, clang): the snapshot reader, the pickle reader, the
# analysis behind every report, replay (and --sweep), html, check, recommend,
# diff and convert's round trip, each run briefly from testdata/ as a CTest;
# docs/RELIABILITY.md has the long runs. Any crash, leak, timeout or OOM fails.
fuzz() {
  configure build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DCACHEALLOC_BUILD_FUZZERS=ON \
    -DCACHEALLOC_BUILD_TESTS=OFF -DCACHEALLOC_BUILD_BENCH=OFF -DCACHEALLOC_FUZZ_SECONDS="${FUZZ_SECONDS:-30}"
  cmake --build build-fuzz -j"$jobs" --target fuzz_snapshot_reader fuzz_pickle_reader fuzz_analysis fuzz_replay \
    fuzz_html fuzz_check fuzz_recommend fuzz_diff fuzz_convert
  ctest --test-dir build-fuzz --output-on-failure -j1 -R '^fuzz_'
}

case "$mode" in
  build) normal_build ;;
  demo)
    # Only the two programs the demo runs; the tests and benchmarks build in ./dev.sh test.
    echo "building cachealloc-seed-example and cachealloc-analyze only: 5 min 28 s measured from a fresh clone" \
         "on a 2-core machine; a rebuild takes seconds"
    normal_build cachealloc-seed-example cachealloc-analyze
    # Record the seed example's memory history, then explain it.
    ./build/bin/cachealloc-seed-example --snapshot snapshot.bin
    ./build/bin/cachealloc-analyze snapshot.bin
    ;;
  test)
    normal_build
    ctest --test-dir build --output-on-failure -j"$jobs"
    asan
    tsan
    fuzz
    ;;
  asan) asan ;;
  tsan) tsan ;;
  fuzz) fuzz ;;
esac
