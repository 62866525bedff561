#!/usr/bin/env bash
# Session 5 on the H200 (docs/VERIFICATION.md): every suite on the cuda
# backend and every conformance sequence on the cuda device and on the
# simulated one, after the session's changes (private pools, the unwinder,
# the readers' validation, the replay); then issue 17's checks
# (run_h200_issue17.sh). Binaries built on the dev VM into build-h200/.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=build-h200/bin
echo "== machine"; date -u; nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== every suite on the cuda backend"
for t in $B/tests/test_*; do
  case $(basename $t) in test_install_consumer|test_browser_report) continue ;; esac
  r=$(CACHEALLOC_TEST_DEVICE=cuda timeout 240 $t 2>&1 | grep -E "test cases:|Status"); echo "$(basename $t): $r"
done
echo "== conformance: every sequence, cuda device"
$B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | grep -c "rows match"
$B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | grep -v "rows match" | tail -5
echo "== conformance: every sequence, simulated device"
$B/cachealloc-conformance testdata/conformance/*.csv 2>&1 | grep -c "rows match"
$B/cachealloc-conformance testdata/conformance/*.csv 2>&1 | grep -v "rows match" | tail -5
echo "== issue 17"
bash docs/verification/run_h200_issue17.sh
echo "== done"; date -u
