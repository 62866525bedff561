#!/usr/bin/env bash
# Session 4 on the H200 (docs/VERIFICATION.md): every suite on the cuda
# backend after issues 12-14; every conformance sequence on the cuda device
# and on the simulated device (the driver address model, no traces) in the
# same run, the two sequences under a real memory limit that diverged on
# cuda in issue 13's second run among them; issue 12's two-process check
# again, with nvidia-smi's rounding. Binaries built on the dev VM into build-h200/.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=build-h200/bin
echo "== machine"; date -u; nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== every suite on the cuda backend"
for t in $B/tests/test_*; do
  case $(basename $t) in test_install_consumer) continue ;; esac
  r=$(CACHEALLOC_TEST_DEVICE=cuda timeout 240 $t 2>&1 | grep -E "test cases:|Status"); echo "$(basename $t): $r"
done
echo "== conformance: every sequence, cuda device"
$B/cachealloc-conformance --device cuda testdata/conformance/*.csv 2>&1 | tail -40
echo "== conformance: every sequence, simulated device (driver address model, no traces)"
$B/cachealloc-conformance testdata/conformance/*.csv 2>&1 | tail -40
echo "== issue 12: two processes on the GPU against nvidia-smi"
sed 's#build-h12-h200#build-h200#g' docs/verification/run_h200_issue12.sh > /tmp/issue12.sh
bash /tmp/issue12.sh 2>&1 | sed -n '/at the dumps/,/ALL EQUAL\|SOME DIFFER/p'
echo "== done"; date -u
