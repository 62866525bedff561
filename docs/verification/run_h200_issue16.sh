#!/usr/bin/env bash
# Issue 16 on the H200 (docs/VERIFICATION.md): a fragmenting workload recorded
# from PyTorch 2.11, replayed through our allocator on the simulated device
# under its own settings (self-consistency against PyTorch's memory_stats) and
# under candidate settings at an 11 GiB cap, where the recorded settings run
# out of memory; the candidate with the lowest replayed peak that fits is then
# run for real under that setting and cap, and its real peak is compared with
# the replayed one. Binaries built on the dev VM into build-h200/ (carry
# build-h200/bin and build-h200/syslib). Outputs under $OUT.
set -u
export LD_LIBRARY_PATH=$PWD/build-h200/syslib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
B=build-h200/bin/cachealloc-analyze
W=docs/verification/issue16_fragmenting_workload.py
O=${OUT:-/tmp/issue16}; mkdir -p "$O"
CAP=$((11 * 1024 * 1024 * 1024))
unset PYTORCH_ALLOC_CONF PYTORCH_HIP_ALLOC_CONF
echo "== machine"; date -u; nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"

echo "== 1. record under the default settings, no cap"
PYTORCH_CUDA_ALLOC_CONF= python3 $W record "$O/recorded.pickle" | tee "$O/recorded.json"

echo "== 2. replay with its own settings (no cap): must equal PyTorch's figures above"
$B replay "$O/recorded.pickle" --format json -o "$O/replay_own.json" -f
$B replay "$O/recorded.pickle" | tee "$O/replay_own.txt"

echo "== 3. replay under candidate settings at the cap ($CAP bytes)"
for set in default expandable_segments=True max_split_size_mb=200 roundup_power2_divisions=4 garbage_collection_threshold=0.8; do
  name=${set//[=:]/_}
  args=(); [ "$set" = default ] || args=(--set "$set")
  $B replay "$O/recorded.pickle" "${args[@]}" --capacity $CAP --format json -o "$O/replay_$name.json" -f
done

echo "== 4. the verdict, 5. the real runs, 6. the comparison"
O="$O" CAP=$CAP W=$W python3 - <<'PY'
import json, os, subprocess
O, CAP, W = os.environ["O"], int(os.environ["CAP"]), os.environ["W"]
def table(doc, name): return {row["figure"]: row for row in doc[name]}
def replay(name): return json.load(open(f"{O}/replay_{name}.json"))
rec = json.load(open(f"{O}/recorded.json"))
own = json.load(open(f"{O}/replay_own.json"))
m, c = table(own, "memory"), table(own, "counts")
print("self-consistency (PyTorch's memory_stats vs the replay with the recorded settings):")
checks = [("peak_reserved", rec["peak_reserved"], m["peak_reserved"]["replayed"]),
          ("peak_allocated", rec["peak_allocated"], m["peak_allocated"]["replayed"]),
          ("segments", rec["segments"], c["segments_at_end"]["replayed"]),
          ("device_allocs", rec["device_allocs"], c["device_allocs"]["replayed"]),
          ("device_frees", rec["device_frees"], c["device_frees"]["replayed"]),
          ("retries", rec["retries"], c["alloc_retries"]["replayed"]),
          ("ooms", rec["ooms"], c["ooms"]["replayed"])]
for key, real, rep in checks: print(f"  {key:15} pytorch {real:>14}  replay {rep:>14}  {'EQUAL' if real == rep else 'DIFFER'}")
candidates = {}
for name in ["default", "expandable_segments_True", "max_split_size_mb_200", "roundup_power2_divisions_4",
             "garbage_collection_threshold_0.8"]:
    d = replay(name)
    peak = table(d, "memory")["peak_reserved"]["replayed"]
    oom = d["outcome"]["replayed_oom_event"]
    candidates[name] = (peak, oom)
    print(f"  at the cap: {name:34} replayed peak reserved {peak:>14}  OOM at event {oom}")
fits = {n: v for n, v in candidates.items() if v[1] is None}
best = min(fits, key=lambda n: fits[n][0]) if fits else None
print("verdict:", f"with {best} peak reserved falls from {rec['peak_reserved']} to {fits[best][0]} bytes; at {CAP} bytes "
      f"the recorded settings run out of memory at event {candidates['default'][1]} and this one does not" if best else "nothing fits")
conf = {"default": "", "expandable_segments_True": "expandable_segments:True", "max_split_size_mb_200": "max_split_size_mb:200",
        "roundup_power2_divisions_4": "roundup_power2_divisions:4",
        "garbage_collection_threshold_0.8": "garbage_collection_threshold:0.8"}
def real(name, pickle=None):
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf[name])
    args = ["python3", W, "run", str(CAP)] + ([pickle] if pickle else [])
    out = subprocess.run(args, env=env, capture_output=True, text=True)
    print(out.stderr[-2000:], end="")
    return json.loads(out.stdout.strip().splitlines()[-1])
r_default = real("default")
print(f"real run, recorded settings at the cap: OOM at step {r_default['oom_step']} (ooms {r_default['ooms']}); "
      f"the replay said OOM at event {candidates['default'][1]}: {'AGREE' if (r_default['ooms'] > 0) == (candidates['default'][1] is not None) else 'DISAGREE'}")
if best:
    r = real(best, f"{O}/real_{best}.pickle")
    json.dump(r, open(f"{O}/real_{best}.json", "w"))
    print(f"real run with {conf[best]} at the cap: peak reserved {r['peak_reserved']}, OOM step {r['oom_step']}")
    print(f"  replayed peak reserved {fits[best][0]}  real {r['peak_reserved']}  {'EQUAL' if fits[best][0] == r['peak_reserved'] else 'DIFFER'}")
    print(f"  real run out of memory: {'no' if r['ooms'] == 0 else 'YES'}")
PY
echo "== 7. the real run under the best setting, recorded, replayed with its own settings"
for f in "$O"/real_*.pickle; do [ -e "$f" ] && $B replay "$f" | sed -n '/Memory/,/Outcome/p'; done
echo "== done"; date -u
