#!/usr/bin/env bash
# Session 12 on the H200, fifth call: where the 3M-entry PyTorch pickle's summary spends its time, phase by phase,
# from a build with temporary timing probes (CA_PHASES=1; not committed: the probes printed to stderr).
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/big && python3 testdata/pytorch/make_snapshots.py /tmp/big big 1000000 > /dev/null 2>&1
ls -l /tmp/big/big.pickle
for r in 1 2 3; do echo "-- round $r, all cores"; /usr/bin/time -f "wall %e s user %U sys %S rss %M KiB" env CA_PHASES=1 build-h200/rel/cachealloc-analyze-phases summary /tmp/big/big.pickle 2>&1 >/dev/null; done
echo "-- one analysis thread"; CA_PHASES=1 build-h200/rel/cachealloc-analyze-phases summary /tmp/big/big.pickle --analysis-threads 1 2>&1 >/dev/null
grep -E "THP|AnonHugePages" /proc/meminfo; cat /sys/kernel/mm/transparent_hugepage/enabled
