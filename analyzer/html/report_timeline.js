// The cachealloc HTML report's page script, part: the timeline (uPlot):
// allocated stacked by category, reserved and active as lines, the peaks
// labelled, the legend and the hovered band's top sites and stack.
// The parts (report_*.js, in the order assets.cmake lists them) share one
// function scope: report_data.js opens it, report_main.js closes it.
  // ---- timeline (uPlot) ----------------------------------------------------
  // OOM has its own colour: never the reserved line's red.
  const COLORS = { allocated: '#222222', reserved: '#d62728', active: '#7f7f7f', oom: '#8a2be2', empty_cache: '#1f77b4', moment: '#000000' };
  const CAT_COLORS = { parameter: '#4e79a7', gradient: '#f28e2b', optimizer_state: '#59a14f', activation: '#76b7b2', temporary: '#edc948',
                       workspace: '#ff9da7', cuda_graph_pool: '#9c755f', other: '#bab0ac' };
  const catColor = (k) => CAT_COLORS[CATS[k].key] || '#bbb';
  const catName = (k) => CATS[k].label + (CATS[k].inferred ? ' (inferred)' : '');
  const timelineDiv = $('timeline');
  const width = () => Math.max(600, timelineDiv.clientWidth || document.body.clientWidth - 40);
  const TIMELINE_HEIGHT = 380;
  const AXIS_FONT = '12px sans-serif';
  const byteAxis = (u, splits) => splits.map((v) => fmtTick(v));
  const byteIncrs = Array.from({ length: 52 }, (_, i) => 2 ** i);  // ticks at 16 MiB, 32 MiB..., not 19.07 MiB
  // Event ticks short enough not to run into each other: 1.2M, 350k.
  const shortCount = (v) => v >= 1e6 ? +(v / 1e6).toFixed(2) + 'M' : v >= 1e4 ? +(v / 1e3).toFixed(1) + 'k' : Math.round(v).toLocaleString('en');
  const xValues = (u, splits) => splits.map((v) => xmode === 'time' ? (v).toFixed(3) + ' s' : shortCount(v));
  // The y axis is as wide as its longest tick, plus the tick marks and a gap,
  // so its title never overlaps the ticks.
  const measure = (() => { const ctx = document.createElement('canvas').getContext('2d'); return (text, font) => { ctx.font = font; return ctx.measureText(text).width; }; })();
  const AXIS_GAP = 8, TICK_SIZE = 6;
  report.axisFit = { widest: 0, size: 0 };
  function yAxisSize(u, values) {
    const widest = Math.max(40, ...(values || []).map((v) => measure(v, AXIS_FONT)));
    const size = Math.ceil(widest + TICK_SIZE + 2 * AXIS_GAP);
    report.axisFit = { widest, size, tick: TICK_SIZE, gap: AXIS_GAP };
    return size;
  }
  function xOf(event) {  // an event's x value in the current mode
    if (xmode === 'event' || !current) return event;
    let lo = 0, hi = current.ev.length - 1;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (current.ev[mid] <= event) lo = mid; else hi = mid - 1; }
    return current.t[lo] / 1e9;
  }
  function eventAt(u, left) {  // the drawn point nearest to a pixel
    const v = u.posToVal(left, 'x');
    const xs = u.data[0];
    let lo = 0, hi = xs.length - 1;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (xs[mid] < v) lo = mid + 1; else hi = mid; }
    if (lo > 0 && Math.abs(xs[lo - 1] - v) < Math.abs(xs[lo] - v)) --lo;
    return { index: lo, event: current.ev[lo] };
  }
  // The peaks' dots and the selected moment; their labels are HTML
  // (placePeakLabels), left-aligned and kept inside the plot.
  function drawOverlays(u) {
    const ctx = u.ctx, top = u.bbox.top, h = u.bbox.height, left = u.bbox.left, w = u.bbox.width;
    ctx.save();
    ctx.beginPath(); ctx.rect(left, top, w, h); ctx.clip();
    const [v0, v1] = report.view;
    for (const metric of ['allocated', 'reserved']) {
      const p = peakOf(metric);
      if (!p || p.event === null || p.event < v0 || p.event > v1) continue;
      const x = u.valToPos(xOf(p.event), 'x', true), y = u.valToPos(p.bytes, 'y', true);
      ctx.fillStyle = metric === 'allocated' ? COLORS.allocated : COLORS.reserved;
      ctx.beginPath(); ctx.arc(x, y, 4 * devicePixelRatio, 0, 2 * Math.PI); ctx.fill();
    }
    if (report.moment !== null && report.moment >= v0 && report.moment <= v1) {
      const x = u.valToPos(xOf(report.moment), 'x', true);
      ctx.strokeStyle = COLORS.moment; ctx.lineWidth = 1; ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.stroke();
    }
    ctx.restore();
    placePeakLabels(u);
    drawMarkers(u);
  }
  function placePeakLabels(u) {
    const box = $('timeline-labels'), over = u.over.getBoundingClientRect(), outer = $('timeline-box').getBoundingClientRect();
    Object.assign(box.style, { left: (over.left - outer.left) + 'px', top: (over.top - outer.top) + 'px', width: over.width + 'px', height: over.height + 'px' });
    box.innerHTML = '';
    const [v0, v1] = report.view, placed = [];
    for (const metric of ['allocated', 'reserved']) {
      const p = peakOf(metric);
      if (!p || p.event === null || p.event < v0 || p.event > v1) continue;
      const x = u.valToPos(xOf(p.event), 'x'), y = u.valToPos(p.bytes, 'y');
      const label = el('span', { className: 'chart-label' }, 'peak ' + esc(metric) + ' ' + fmtBytes(p.bytes));
      label.style.color = metric === 'allocated' ? COLORS.allocated : COLORS.reserved;
      box.append(label);
      const lw = label.offsetWidth, lh = label.offsetHeight;
      // Right of the dot where it fits, else left of it; never past the plot.
      let lx = x + 8 + lw <= over.width ? x + 8 : x - 8 - lw;
      lx = Math.max(0, Math.min(over.width - lw, lx));
      let ly = Math.max(0, Math.min(over.height - lh, y - lh - 2));
      for (const q of placed) if (Math.abs(q - ly) < lh) ly = Math.min(over.height - lh, q + lh);
      placed.push(ly);
      label.style.left = lx + 'px'; label.style.top = ly + 'px';
    }
  }
  const stepped = uPlot.paths.stepped({ align: 1 });
  // Series: x, then allocated stacked by category (the sum through the last
  // category first, so that each opaque fill paints over the one below it),
  // then allocated, reserved and active as lines.
  const catSeries = (k) => CATS.length - k;  // series index of the band of category k
  const S_ALLOCATED = CATS.length + 1, S_RESERVED = CATS.length + 2, S_ACTIVE = CATS.length + 3;
  const series = [{ label: 'x' }];
  for (let j = CATS.length - 1; j >= 0; --j) series.push({ label: CATS[j].label, stroke: catColor(j), fill: catColor(j), width: 0, paths: stepped, points: { show: false } });
  series.push({ label: 'allocated', stroke: COLORS.allocated, width: 1, paths: stepped, points: { show: false } },
              { label: 'reserved', stroke: COLORS.reserved, width: 1.5, paths: stepped, points: { show: false } },
              { label: 'active', stroke: COLORS.active, width: 1, dash: [5, 3], paths: stepped, points: { show: false } });
  const timeline = new uPlot({
    width: width(), height: TIMELINE_HEIGHT,
    scales: { x: { time: false }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.08 : 1] } },
    axes: [{ label: 'event index', values: xValues, font: AXIS_FONT, labelFont: 'bold ' + AXIS_FONT },
           { label: 'bytes', values: byteAxis, incrs: byteIncrs, size: yAxisSize, gap: AXIS_GAP, ticks: { size: TICK_SIZE }, font: AXIS_FONT, labelFont: 'bold ' + AXIS_FONT, labelGap: 4 }],
    series,
    cursor: { drag: { x: true, y: false, setScale: false }, points: { show: false } },
    legend: { show: false },
    hooks: {
      draw: [drawOverlays],
      setCursor: [onCursor],
      setSelect: [(u) => {
        if (u.select.width < 3) return;
        const a = eventAt(u, u.select.left).event, b = eventAt(u, u.select.left + u.select.width).event;
        const bEnd = current.exact ? b : Math.min(N - 1, b + current.width - 1);
        u.setSelect({ left: 0, width: 0 }, false);
        setView(a, Math.max(a, bEnd));
      }],
    },
  }, series.map(() => []), timelineDiv);

  // The legend: the figures under the cursor, or at the window's peak when
  // the cursor is off the chart (never "unknown" for a known figure).
  function peakIndex() {
    let best = 0;
    for (let j = 1; j < current.amax.length; ++j) if (current.amax[j] > current.amax[best]) best = j;
    return best;
  }
  function pointName(j) {
    const e = current.ev[j];
    return current.exact ? 'after event #' + e.toLocaleString('en') : 'events #' + e.toLocaleString('en') + ' to #' + Math.min(N - 1, e + current.width - 1).toLocaleString('en') + ', where allocated peaked';
  }
  const usedCategories = () => CATS.map((c, k) => k).filter((k) => levels[0].cats[k].some((v) => v > 0) || (current && current.cats[k].some((v) => v > 0)));
  const markerCount = (kind) => { const row = (report.markerRows || []).find((r) => r.kind === kind); return row ? row.count.toLocaleString('en') + ' in the window' : 'none'; };
  function renderLegend(j) {
    if (!current || current.amax.length === 0) return;
    const hovered = j !== null && j !== undefined;
    if (!hovered) j = peakIndex();
    const item = (color, name, value, cls) => '<span class="' + (cls || '') + '"><i style="background:' + color + '"></i>' + name + (value === undefined ? '' : ' <b>' + value + '</b>') + '</span>';
    let html = '<div class="legend-head">' + (hovered ? '' : 'Cursor off the chart: at the peak of the window, ') + esc(pointName(j)) + '</div><div>';
    for (const k of usedCategories()) html += item(catColor(k), esc(CATS[k].label) + (CATS[k].inferred ? ' <em class="inferred">inferred</em>' : ''), fmtBytes(current.cats[k][j]), 'cat');
    html += '</div><div>' + item(COLORS.allocated, 'allocated', fmtBytes(current.amax[j])) + item(COLORS.reserved, 'reserved', fmtBytes(current.rmax[j])) +
      item(COLORS.active, 'active (allocated + pending frees)', fmtBytes(current.cmax[j])) + item(COLORS.oom, 'OOM', markerCount('oom')) + item(COLORS.empty_cache, 'empty_cache', markerCount('empty_cache')) +
      '<span><i class="dot"></i>peak (as <code>summary</code>)</span></div>';
    $('timeline-legend').innerHTML = html;
    report.legendText = $('timeline-legend').textContent;
  }

  // The band under the cursor: its category, and its top sites and the
  // largest one's stack at that point (replayed from the nearest keyframe).
  let hoverKey = null;
  function onCursor(u) {
    const j = u.cursor.idx;
    renderLegend(j);
    if (j === null || j === undefined || u.cursor.top < 0) { if (hoverKey !== null) { hoverKey = null; hideTip(); } return; }
    const v = u.posToVal(u.cursor.top, 'y');
    let below = 0, k = -1;
    for (let c = 0; c < CATS.length; ++c) { const top = below + current.cats[c][j]; if (v >= below && v < top) { k = c; break; } below = top; }
    if (k < 0) { if (hoverKey !== null) { hoverKey = null; hideTip(); } return; }
    const over = u.over.getBoundingClientRect();
    const at = { clientX: over.left + u.cursor.left, clientY: over.top + u.cursor.top, pageX: over.left + scrollX + u.cursor.left, pageY: over.top + scrollY + u.cursor.top };
    const key = j + ':' + k;
    if (key !== hoverKey) { hoverKey = key; report.bandTip = bandTip(j, k); }
    showTip(at, report.bandTip.html);
  }
  function bandTip(j, k) {
    const e = current.exact ? current.ev[j] : peakIn(current.ev[j], Math.min(N - 1, current.ev[j] + current.width - 1));
    const layout = e === null ? null : layoutAfter(e);
    if (!layout && e !== null && e < RING_BEGINS)  // a trace begun mid-run, before its first memory event
      return { event: null, category: CATS[k].key, bytes: null, sites: null,
               html: 'before event #' + RING_BEGINS.toLocaleString('en') + ', the ring\'s first memory event: no memory was recorded here' };
    if (!layout) {  // outside the detail windows: the bucket's figure, no sites
      const html = '<b>' + esc(catName(k)) + '</b>: ' + fmtBytes(current.cats[k][j]) + ' in ' + esc(pointName(j)) + '<br><i>the sites here are not in this page: event-level detail kept only for ' + esc(detailList()) + '</i>';
      return { event: null, category: CATS[k].key, bytes: current.cats[k][j], sites: null, html };
    }
    const rows = liveBySite(layout, (b) => b.category === k);
    let html = '<b>' + esc(catName(k)) + '</b>: ' + fmtBytes(current.cats[k][j]) + ' after event #' + e.toLocaleString('en');
    html += '<br>' + rows.slice(0, 5).map((r, i) => (i + 1) + '. ' + fmtBytes(r.bytes) + ' in ' + r.blocks + ' blocks: ' + esc(siteLabel(r.site))).join('<br>');
    if (rows.length > 5) html += '<br>' + (rows.length - 5) + ' more sites';
    if (rows.length) html += '<br><br><b>stack of the largest</b><br>' + siteLines(rows[0].site).map(esc).join('<br>');
    html += '<br><br><i>click for every block at this event</i>';
    return { event: e, category: CATS[k].key, bytes: current.cats[k][j], sites: rows.map((r) => ({ site: siteName(r.site), bytes: r.bytes })), html };
  }

  function setView(a, b) {
    a = Math.max(0, Math.min(N - 1, Math.round(a))); b = Math.max(a, Math.min(N - 1, Math.round(b)));
    report.view = [a, b];
    // No events: the one state there is, the layout the file holds.
    current = N === 0 ? { exact: true, ev: [0], t: [0], amax: [meta.start[0]], amin: [meta.start[0]], rmax: [meta.start[1]], cmax: [meta.start[2]],
                          cats: Array.from(layoutAfter(-1).byCategory, (v) => [v]) } : seriesFor(a, b);
    const xs = xmode === 'time' ? Array.from(current.t, (t) => t / 1e9) : Array.from(current.ev);
    timeline.axes[0].label = xmode === 'time' ? 'time since the first event (s)' : 'event index';
    const n = current.amax.length, data = series.map(() => null);
    data[0] = xs;
    let sum = new Float64Array(n);
    for (let k = 0; k < CATS.length; ++k) {
      const next = new Float64Array(n);
      for (let j = 0; j < n; ++j) next[j] = sum[j] + current.cats[k][j];
      data[catSeries(k)] = next; sum = next;
    }
    current.stackTop = sum;
    data[S_ALLOCATED] = current.amax; data[S_RESERVED] = current.rmax; data[S_ACTIVE] = current.cmax;
    // Before the ring's first memory event (a trace begun mid-run that
    // opens with older annotations) no memory was recorded: no line there.
    const last = (j) => current.ev[j] + (current.exact ? 0 : current.width - 1);
    if (RING_BEGINS > 0 && n > 0 && last(0) < RING_BEGINS)
      for (let k = 1; k < data.length; ++k) data[k] = Array.from(data[k], (v, j) => last(j) < RING_BEGINS ? null : v);
    timeline.setData(data);
    let peak = 0;
    for (let j = 0; j < current.amax.length; ++j) peak = Math.max(peak, current.amax[j]);
    let peakReserved = 0;
    for (let j = 0; j < current.rmax.length; ++j) peakReserved = Math.max(peakReserved, current.rmax[j]);
    const whole = a <= RING_BEGINS && b >= N - 1;
    report.timelinePeak = whole ? Math.max(peak, meta.start[0]) : peak;
    report.timelinePeakReserved = whole ? Math.max(peakReserved, meta.start[1]) : peakReserved;
    $('window-label').textContent = 'window: events #' + a.toLocaleString('en') + ' to #' + b.toLocaleString('en') +
      (current.exact ? ' (every event)' : ' (each point: the largest allocated of ' + current.width + ' events)') +
      (RING_BEGINS > 0 ? '; memory recorded from event #' + RING_BEGINS.toLocaleString('en') +
        ' on: the trace begins mid-run, and no memory of this device was recorded before it' : '');
    // A window small enough to draw event by event, outside the detail windows.
    report.detailNote = !current.exact && b - a + 1 <= exactLimit ? 'Event-level detail kept only for ' + detailList() +
      ': see `cachealloc-analyze timeline --from ' + a + ' --to ' + b + '` or html --from/--to.' : '';
    $('detail-note').textContent = report.detailNote;
    renderLegend(null);
    const w0 = performance.now();
    windowSites(a, b);
    timings.windowSites = Math.round(performance.now() - w0);
    fragmentationView(a, b);
  }

  timeline.over.addEventListener('mousedown', (ev) => { timeline._down = [ev.clientX, ev.clientY]; });
  timeline.over.addEventListener('mouseup', (ev) => {
    const d = timeline._down; timeline._down = null;
    if (!d || Math.abs(ev.clientX - d[0]) > 3 || current.ev.length === 0) return;
    const rect = timeline.over.getBoundingClientRect(), x = ev.clientX - rect.left;
    // A click snaps to the highest allocated point within 3 pixels.
    const lo = eventAt(timeline, Math.max(0, x - 3)), hi = eventAt(timeline, Math.min(rect.width, x + 3));
    const from = current.ev[lo.index], to = current.exact ? current.ev[hi.index] : Math.min(N - 1, current.ev[hi.index] + current.width - 1);
    const e = peakIn(from, to);
    selectMoment(e === null ? from : e);
  });
  timeline.over.addEventListener('dblclick', () => setView(RING_BEGINS, N - 1));
  timeline.over.addEventListener('wheel', (ev) => {
    ev.preventDefault();
    const [a, b] = report.view, span = b - a + 1;
    if (ev.shiftKey) { const shift = Math.round(span * 0.2 * Math.sign(ev.deltaY || ev.deltaX)); setView(Math.max(0, Math.min(N - span, a + shift)), Math.max(0, Math.min(N - span, a + shift)) + span - 1); return; }
    const rect = timeline.over.getBoundingClientRect(), at = eventAt(timeline, ev.clientX - rect.left).event;
    const factor = ev.deltaY < 0 ? 0.7 : 1 / 0.7, newSpan = Math.max(10, Math.min(N, Math.round(span * factor)));
    const start = Math.round(at - (at - a) * newSpan / span);
    setView(Math.max(0, start), Math.max(0, start) + newSpan - 1);
  }, { passive: false });
  const pan = (dir) => { const [a, b] = report.view, span = b - a + 1, start = Math.max(0, Math.min(N - span, a + dir * Math.round(span / 2))); setView(start, start + span - 1); };
  $('pan-left').onclick = () => pan(-1);
  $('pan-right').onclick = () => pan(1);
  $('zoom-out').onclick = () => { const [a, b] = report.view, span = b - a + 1, mid = (a + b) / 2; setView(mid - span, mid + span); };
  $('reset').onclick = () => setView(RING_BEGINS, N - 1);
  for (const radio of document.querySelectorAll('input[name=xmode]')) radio.onchange = () => { xmode = radio.value; setView(...report.view); };

