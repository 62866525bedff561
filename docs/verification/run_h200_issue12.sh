#!/usr/bin/env bash
# Issue 12 on the H200 (docs/VERIFICATION.md, "Issue 12: what nvidia-smi
# shows, recorded"): two of our processes share the GPU, one also reserves
# 1 GiB beside the allocator with cudaMalloc; both dump a snapshot at one
# moment while nothing changes; nvidia-smi is read at that moment; the
# snapshots' NVML figures are compared with nvidia-smi's. Then the NVML
# suite on the cuda backend. Binaries built on the dev VM into build-h12-h200/.
set -u
export LD_LIBRARY_PATH=$PWD/build-h12-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=build-h12-h200/bin
W=/tmp/issue12; rm -rf $W; mkdir -p $W
echo "== machine"; date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== before: nvidia-smi"; nvidia-smi --query-gpu=memory.used,memory.reserved,memory.free,memory.total --format=csv
export CACHEALLOC_DEVICE=cuda
$B/cachealloc-example-shared-gpu --allocate-mib 3072 --outside-mib 1024 --snapshot $W/p1.bin --sync $W/p1 > $W/p1.log 2>&1 &
P1=$!
$B/cachealloc-example-shared-gpu --allocate-mib 2048 --snapshot $W/p2.bin --sync $W/p2 > $W/p2.log 2>&1 &
P2=$!
for p in p1 p2; do for i in $(seq 600); do [ -e $W/$p.ready ] && break; sleep 0.1; done; done
touch $W/p1.go $W/p2.go
for p in p1 p2; do for i in $(seq 600); do [ -e $W/$p.done ] && break; sleep 0.1; done; done
echo "== at the dumps (both processes hold still): nvidia-smi"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | tee $W/apps.csv
nvidia-smi --query-gpu=memory.used,memory.reserved,memory.free,memory.total --format=csv,noheader,nounits | tee $W/gpu.csv
echo "pids: p1=$P1 p2=$P2"
touch $W/p1.quit $W/p2.quit
wait $P1; echo "p1 exit $?"; wait $P2; echo "p2 exit $?"
cat $W/p1.log $W/p2.log
for p in p1 p2; do
  echo "== $p: cachealloc-analyze summary"
  $B/cachealloc-analyze $W/$p.bin | sed -n '/from allocated/,/^$/p'
  $B/cachealloc-analyze $W/$p.bin --format json > $W/$p.json
done
python3 - $W <<'PY'
import json, sys
w = sys.argv[1]
MiB = 1 << 20
apps = {int(l.split(',')[0]): int(l.split(',')[1]) for l in open(f'{w}/apps.csv') if l.strip()}
used, reserved, free, total = (int(x) for x in open(f'{w}/gpu.csv').read().split(','))
ok = True
# nvidia-smi prints whole MiB, rounded up (the first run, 2026-12-01,
# showed 7202.44 MiB as 7203 and 615.06 MiB as 616): compare with the
# snapshot's exact bytes rounded up the same way.
def same(what, ours_bytes, smi_mib):
    global ok
    good = -(-ours_bytes // MiB) == smi_mib
    ok &= good
    print(f"  {what:34s} snapshot {ours_bytes:>14d} B = {ours_bytes / MiB:10.2f} MiB   nvidia-smi {smi_mib:>7d} MiB   {'equal' if good else 'DIFFERENT'}")
for p in ('p1', 'p2'):
    d = json.load(open(f'{w}/{p}.json'))
    g = d['gap']
    pid = int(open(f'{w}/{p}.log').read().split()[1].rstrip(':'))
    print(f"{p} (pid {pid}): reserved {g['reserved']} B, outside the allocator in the process {g['process_outside_allocator']} B")
    same('this process (used_memory)', g['process_used'], apps.get(pid, -1))
    same('other processes (used_memory)', g['other_processes_used'], sum(v for k, v in apps.items() if k != pid))
    same('device used (memory.used)', g['device_used'], used)
    same('driver reserved (memory.reserved)', g['device_reserved'], reserved)
    same('free (memory.free)', g['device_free'], free)
    same('device total (memory.total)', g['device_total'], total)
print('ALL EQUAL' if ok else 'SOME DIFFER')
PY
echo "== the NVML suite on the cuda backend"
CACHEALLOC_TEST_DEVICE=cuda $B/tests/test_device_usage 2>&1 | tail -3
echo "== the seed example on the H200"
$B/cachealloc-seed-example 2>&1
cp $W/*.json $W/*.csv $W/*.log ${OUT:-/tmp}/ 2>/dev/null
echo done
