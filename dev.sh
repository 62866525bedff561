#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine (root or sudo):
#   ./dev.sh demo   install what is missing, build, run the main job
#   ./dev.sh test   install what is missing, build, run every test
# The cuda backend is built when a CUDA toolkit is found (CUDAToolkit_ROOT or
# /usr/local/cuda); without one everything else still builds and the demo runs
# on the simulated device.
set -euo pipefail
cd "$(dirname "$0")"
mode=${1:-demo}
case "$mode" in demo|test|build) ;; *) echo "usage: $0 demo|test|build" >&2; exit 2 ;; esac

packages=(cmake g++ make libcereal-dev libcli11-dev libboost-stacktrace-dev doctest-dev python3)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$jobs"

case "$mode" in
  demo)
    # Record the seed example's memory history, then explain it.
    ./build/bin/cachealloc-seed-example --snapshot snapshot.bin
    ./build/bin/cachealloc-analyze snapshot.bin
    ;;
  test)
    ctest --test-dir build --output-on-failure -j"$jobs"
    ;;
esac
