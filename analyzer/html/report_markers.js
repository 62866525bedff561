// The cachealloc HTML report's page script, part: the marker strip under the
// timeline: phases (annotations), OOMs and empty_cache calls as ticks on the
// time axis, binned by pixel, with their counts in the row labels and on
// hover, instead of full-height lines that hide the curves.
// The parts (report_*.js, in the order assets.cmake lists them) share one
// function scope: report_data.js opens it, report_main.js closes it.
  // ---- marker strip ----------------------------------------------------------
  const MARKER_ROW = 16, MARKER_FONT = '11px sans-serif';
  const markerRows = [];
  if (annotations.length) markerRows.push({ kind: 'phase', title: 'phases' });
  for (const kind of ['oom', 'empty_cache']) if (markers.some((m) => m[0] === kind)) markerRows.push({ kind, title: kind === 'oom' ? 'OOM' : 'empty_cache' });
  const strip = $('markers');
  strip.style.height = (markerRows.length * MARKER_ROW + (markerRows.length ? 4 : 0)) + 'px';
  const stripCanvas = el('canvas', { className: 'marker-canvas' });
  strip.append(stripCanvas);
  const PHASE_COLORS = ['#fde0a6', '#cfe3f7', '#e3d3f2', '#cfeedd'];
  const hashName = (s) => { let h = 0; for (let i = 0; i < s.length; ++i) h = (h * 31 + s.charCodeAt(i)) >>> 0; return h; };
  let stripBins = [];  // per row: the bins drawn, for hover and the tests
  function drawMarkers(u) {
    if (!markerRows.length || !current) return;
    const dpr = devicePixelRatio, w = u.over.clientWidth, left = u.over.offsetLeft;
    const W = strip.clientWidth, H = markerRows.length * MARKER_ROW + 4;
    stripCanvas.width = W * dpr; stripCanvas.height = H * dpr;
    stripCanvas.style.width = W + 'px'; stripCanvas.style.height = H + 'px';
    for (const old of strip.querySelectorAll('.marker-label')) old.remove();
    const ctx = stripCanvas.getContext('2d');
    ctx.scale(dpr, dpr);
    const [v0, v1] = report.view;
    const xPos = (event) => left + u.valToPos(xOf(Math.max(v0, Math.min(v1, event))), 'x');
    const label = (text, x, y, maxRight, cls) => {
      const span = el('span', { className: 'marker-label ' + (cls || '') }, esc(text));
      span.style.left = x + 'px'; span.style.top = y + 'px';
      if (x + measure(text, MARKER_FONT) + 2 > maxRight) return null;  // would not fit: on hover only
      strip.append(span);
      return span;
    };
    stripBins = markerRows.map((row, r) => {
      const y = r * MARKER_ROW + 2, bins = new Map();
      // The row's title, left-aligned in the y axis' gutter, with its count in the window.
      let count = 0;
      if (row.kind === 'phase') {
        for (const [name, begin, end, depth] of annotations) {
          if (end < v0 || begin > v1 || depth > 1) continue;
          ++count;
          const x0 = xPos(begin), x1 = Math.max(x0 + 1, xPos(end));
          ctx.fillStyle = PHASE_COLORS[(hashName(meta.strings[name] || '') + depth) % PHASE_COLORS.length];
          const h = depth ? MARKER_ROW / 2 - 1 : MARKER_ROW - 2;
          ctx.fillRect(x0, y + (depth ? MARKER_ROW / 2 : 0), x1 - x0, h);
          if (depth === 0) {
            const key = Math.floor(x0 / 2);
            if (!bins.has(key)) bins.set(key, { x0, x1, events: [begin, end], names: [] });
            const bin = bins.get(key); bin.x1 = Math.max(bin.x1, x1); bin.events[1] = Math.max(bin.events[1], end); bin.names.push(meta.strings[name] || '');
            if (x1 - x0 > 30) { const s = label(meta.strings[name] || '', x0 + 2, y, x1 - 2, 'phase'); if (s) { s.dataset.x0 = x0; s.dataset.x1 = x1; } }
          }
        }
      } else {
        ctx.fillStyle = row.kind === 'oom' ? COLORS.oom : COLORS.empty_cache;
        for (const [kind, event, bytes] of markers) {
          if (kind !== row.kind || event < v0 || event > v1) continue;
          ++count;
          const x = xPos(event), key = Math.floor(x / 3);
          const bin = bins.get(key) || { x0: x, x1: x, events: [event, event], count: 0, largest: 0 };
          bin.count += 1; bin.events[1] = event; bin.largest = Math.max(bin.largest, bytes); bin.x1 = x;
          bins.set(key, bin);
        }
        for (const bin of bins.values()) ctx.fillRect(bin.x0 - 1, y + (bin.count > 1 ? 0 : 3), 3, bin.count > 1 ? MARKER_ROW - 2 : MARKER_ROW - 8);
      }
      ctx.fillStyle = '#eee'; ctx.fillRect(left, y + MARKER_ROW - 1, w, 1);
      label(row.title + ' ' + count.toLocaleString('en'), 2, y, left - 4, 'title') || label(row.title, 2, y, left - 4, 'title');
      return { kind: row.kind, count, bins: [...bins.values()] };
    });
    report.markerRows = stripBins.map((r) => ({ kind: r.kind, count: r.count, ticks: r.bins.length }));
  }
  function markerAt(ev) {
    const rect = stripCanvas.getBoundingClientRect(), x = ev.clientX - rect.left, r = Math.floor((ev.clientY - rect.top - 2) / MARKER_ROW);
    const row = stripBins[r];
    if (!row) return null;
    let best = null;
    for (const bin of row.bins) {
      const d = x < bin.x0 ? bin.x0 - x : x > bin.x1 ? x - bin.x1 : 0;
      if (d <= 3 && (!best || d < best.d)) best = { d, bin };
    }
    return best ? { kind: row.kind, bin: best.bin } : null;
  }
  strip.addEventListener('mousemove', (ev) => {
    const hit = markerAt(ev);
    if (!hit) return hideTip();
    const { kind, bin } = hit, range = 'event #' + bin.events[0].toLocaleString('en') + (bin.events[1] !== bin.events[0] ? ' to #' + bin.events[1].toLocaleString('en') : '');
    if (kind === 'phase') showTip(ev, '<b>' + bin.names.slice(0, 5).map(esc).join(', ') + (bin.names.length > 5 ? ', ' + (bin.names.length - 5) + ' more' : '') + '</b><br>' + range);
    else showTip(ev, '<b>' + (kind === 'oom' ? bin.count + ' out-of-memory error' + (bin.count > 1 ? 's' : '') + '</b>, the largest request ' + fmtBytes(bin.largest) : bin.count + ' empty_cache call' + (bin.count > 1 ? 's' : '') + '</b>') +
      '<br>' + range + '<br><i>click for the state at ' + (bin.count > 1 ? 'the first' : 'it') + '</i>');
  });
  strip.addEventListener('mouseleave', hideTip);
  strip.addEventListener('click', (ev) => { const hit = markerAt(ev); if (hit) selectMoment(hit.bin.events[0]); });
