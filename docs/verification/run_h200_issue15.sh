#!/usr/bin/env bash
# Issue 15 on the H200: PyTorch's own picture of a 3M-event trace, for
# docs/PERFORMANCE.md's comparison with `cachealloc-analyze html`. Makes the
# same PyTorch-shaped pickle the dev VM measured (bench/pickle_vs_python.py
# --make 1000000: 1M allocations, 3M trace entries, seed 3), times
# `python3 -m torch.cuda._memory_viz trace_plot` on it and keeps the page's
# size (not the page: it is large, and it loads its script from a CDN, which
# the host cannot reach, so it is not opened). Self-contained: needs only
# python3 with torch; our html report is timed too when build-h200/bin is there.
# Results in $OUT (default /tmp/issue15): issue15.log.
set -u
OUT=${OUT:-/tmp/issue15}
mkdir -p "$OUT"
exec > >(tee "$OUT/issue15.log") 2>&1
echo "== machine"; date -u; nproc; python3 -c "import torch; print('torch', torch.__version__)"
PICKLE=/tmp/issue15_p3m.pickle
echo "== the pickle (bench/pickle_vs_python.py's make_pytorch_like, 1,000,000 allocations)"
/usr/bin/time -f "made in %e s, peak RSS %M KB" python3 -c "
import sys; sys.path.insert(0, 'bench'); import pickle_vs_python as p
p.make_pytorch_like('$PICKLE', 1000000)"
ls -l "$PICKLE"
python3 -c "
import pickle; d = pickle.load(open('$PICKLE', 'rb'))
print('trace entries:', sum(len(t) for t in d['device_traces']), 'segments:', len(d['segments']))"
RUNS=${RUNS:-2}
echo "== _memory_viz trace_plot (best of $RUNS)"
for run in $(seq "$RUNS"); do
  /usr/bin/time -f "run $run: %e s wall, %U s user, peak RSS %M KB" \
    python3 -m torch.cuda._memory_viz trace_plot "$PICKLE" -o /tmp/issue15_trace_plot.html
  ls -l /tmp/issue15_trace_plot.html
done
if [ -x build-h200/bin/cachealloc-analyze ]; then
  export LD_LIBRARY_PATH=$PWD/build-h200/syslib:${LD_LIBRARY_PATH:-}
  echo "== cachealloc-analyze html on the same pickle (best of $RUNS)"
  for run in $(seq "$RUNS"); do
    /usr/bin/time -f "run $run: %e s wall, %U s user, peak RSS %M KB" \
      build-h200/bin/cachealloc-analyze html "$PICKLE" -o /tmp/issue15_report.html -f
    ls -l /tmp/issue15_report.html
  done
fi
rm -f "$PICKLE" /tmp/issue15_trace_plot.html /tmp/issue15_report.html
echo "== done"; date -u
