// The cachealloc HTML report's page script, part: fragmentation over time, hooks for tests, start.
// The parts (report_*.js, in the order assets.cmake lists them) share one
// function scope: report_data.js opens it, report_main.js closes it.
  // ---- fragmentation over time (uPlot) ------------------------------------
  const fragmentationChart = new uPlot({
    width: width(), height: 240,
    scales: { x: { time: false }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.08 : 1] }, pct: { range: [0, 100] } },
    axes: [{ label: 'event index', values: xValues }, { label: 'bytes', values: byteAxis, incrs: byteIncrs, size: 80 },
           { scale: 'pct', side: 1, label: 'external fragmentation', values: (u, s) => s.map((v) => v + '%'), grid: { show: false } }],
    series: [{ label: 'x' },
      { label: 'largest free block', stroke: '#8c564b', width: 1.5, paths: stepped, value: (u, v) => fmtBytes(v) },
      { label: 'releasable by empty_cache', stroke: '#17becf', width: 1.5, paths: stepped, value: (u, v) => fmtBytes(v) },
      { label: 'cached free', stroke: '#aaa', width: 1, paths: stepped, value: (u, v) => fmtBytes(v) },
      { label: 'external fragmentation', scale: 'pct', stroke: '#e377c2', width: 1.5, paths: stepped, value: (u, v) => v === null ? '' : v.toFixed(1) + '%' }],
    cursor: { drag: { x: false, y: false } },
  }, [[], [], [], [], []], $('fragmentation'));
  function fragmentationView(a, b) {
    const rows = fragmentation.filter((r) => r[0] >= a - 1 && r[0] <= b);
    const ev = rows.map((r) => Math.max(0, r[0]));
    const xs = xmode === 'time' ? ev.map((e) => (current && current.ev.length ? xOf(e) : 0)) : ev;
    fragmentationChart.axes[0].label = xmode === 'time' ? 'time since the first event (s)' : 'event index';
    fragmentationChart.setData([xs, rows.map((r) => r[2]), rows.map((r) => r[3]), rows.map((r) => r[4]), rows.map((r) => 100 * r[1])]);
  }

  window.addEventListener('resize', () => { timeline.setSize({ width: width(), height: TIMELINE_HEIGHT }); fragmentationChart.setSize({ width: width(), height: 240 }); });

  // For tests and scripts: where an event is on screen, and the plot's box.
  report.pixelOf = (event) => {
    timeline.over.scrollIntoView({ block: 'center' });
    const r = timeline.over.getBoundingClientRect();
    return { x: r.left + Math.max(1, Math.min(r.width - 2, timeline.valToPos(xOf(event), 'x'))), y: r.top + r.height / 2 };
  };
  report.plotBox = () => { timeline.over.scrollIntoView({ block: 'center' }); const r = timeline.over.getBoundingClientRect(); return { x: r.left, y: r.top, width: r.width, height: r.height }; };
  report.selectMoment = selectMoment;
  report.axisLabel = () => timeline.axes[0].label;
  report.drawnPoints = () => timeline.data[0].length;
  // Each drawn point's last event and its allocated value (null: not drawn).
  report.drawnAllocated = () => Array.from(timeline.data[S_ALLOCATED], (v, j) =>
    [current.ev[j] + (current.exact ? 0 : current.width - 1), v === null || v === undefined ? null : v]);
  report.ringBegins = RING_BEGINS;
  report.setView = setView;
  report.peakEvent = peakOf('allocated') ? peakOf('allocated').event : null;
  report.keyframes = keyframes.length;
  report.keyframeEvents = keyframes.map((k) => k.before);  // the event each keyframe's state precedes
  report.momentKept = momentKept;
  report.detailWindows = details.map((w) => ({ from: w.from, to: w.to, why: w.why }));  // the events kept event by event

  report.colors = Object.assign({}, COLORS, { categories: CAT_COLORS });
  // The drawn series at `count` points spread over the window: each point's
  // allocated and its categories, for the tests' sums.
  report.seriesSample = (count) => {
    const n = current.amax.length, out = [];
    for (let s = 0; s < Math.min(count, n); ++s) {
      const j = Math.round(s * (n - 1) / Math.max(1, count - 1));
      out.push({ index: j, event: current.ev[j], allocated: current.amax[j], categories: current.cats.map((c) => c[j]), stackTop: current.stackTop[j] });
    }
    return { exact: current.exact, points: out };
  };
  report.hoverBand = (j, k) => bandTip(j, k);

  drawPeakPanel();
  mark('peak panel');
  setView(RING_BEGINS, Math.max(0, N - 1));
  mark('timeline');
  const peak = peakOf('allocated');
  selectMoment(peak && peak.event !== null ? peak.event : N - 1);
  mark('segment map');
  report.timings = timings;
  report.ready = true;
  document.body.dataset.ready = 'true';
})().catch((error) => {
  console.error('cachealloc report: ' + (error && error.stack || error));
  const app = document.getElementById('app');
  if (app) app.textContent = 'The report could not be drawn: ' + error;
});

