// The cachealloc HTML report's page script, part: what was live at the peak
// (by category and by site), sites live at a moment, the icicle, sites of a window.
// The parts (report_*.js, in the order assets.cmake lists them) share one
// function scope: report_data.js opens it, report_main.js closes it.
  // ---- sites live at the moment, and an icicle of their stacks ------------
  // Allocated blocks of a layout by site (those `keep` accepts), largest
  // first, each with its bytes per category.
  function liveBySite(layout, keep) {
    const bySite = new Map();
    for (const seg of layout.segs) for (let b = seg.first; b; b = b.next) {
      if (b.state !== ST.allocated || (keep && !keep(b))) continue;
      const site = siteOfStack(b.stack);
      let s = bySite.get(site);
      if (!s) bySite.set(site, (s = { site, bytes: 0, blocks: 0, cats: new Float64Array(CATS.length) }));
      s.bytes += b.size; s.blocks += 1; s.cats[b.category] += b.size;
    }
    return [...bySite.values()].sort((x, y) => y.bytes - x.bytes || x.site - y.site);
  }
  // A site's categories: the largest by name, the others as swatches (their
  // names and shares on hover).
  function siteCategories(r) {
    const parts = [];
    for (let k = 0; k < CATS.length; ++k) if (r.cats[k] > 0) parts.push([k, r.cats[k]]);
    parts.sort((p, q) => q[1] - p[1]);
    const swatch = ([k, bytes]) => '<span class="swatch" style="background:' + catColor(k) + '" title="' + esc(CATS[k].label) + ' ' + fmtBytes(bytes) + '"></span>';
    return parts.length ? swatch(parts[0]) + esc(CATS[parts[0][0]].label) + (parts.length > 1 ? ' ' + parts.slice(1).map(swatch).join('') : '') : '';
  }
  const siteCell = (site) => '<td class="site-label" data-site="' + site + '" title="' + esc(siteLines(site).join('\n')) + '">' + esc(siteLabel(site)) + '</td>';
  function liveSites(layout, event) {
    const rows = liveBySite(layout);
    report.liveSites = rows.map((r) => ({ site: siteName(r.site), label: siteLabel(r.site), stack: siteLines(r.site), bytes: r.bytes, blocks: r.blocks }));
    const total = rows.reduce((n, r) => n + r.bytes, 0);
    $('live-title').textContent = 'Sites live ' + (event < 0 ? (RING_BEGINS > 0 ? 'at the ring\'s start, before event #' + RING_BEGINS.toLocaleString('en') : 'before the first event') : 'after event #' + event.toLocaleString('en')) + ': ' + fmtBytes(total) + ' allocated in ' + rows.length + ' sites';
    $('live-sites').innerHTML = '<tr><th>#</th><th>live</th><th>blocks</th><th>share</th><th>category</th><th>site</th></tr>' + rows.slice(0, 20).map((r, i) =>
      '<tr><td class="num">' + (i + 1) + '</td><td class="num">' + fmtBytes(r.bytes) + '</td><td class="num">' + r.blocks + '</td><td class="num">' + (total ? (100 * r.bytes / total).toFixed(1) : '0') + '%</td><td>' + siteCategories(r) + '</td>' + siteCell(r.site) + '</tr>').join('');
    // Icicle: root on top, outermost frame first.
    const root = { name: 'all live bytes', bytes: 0, children: new Map() };
    for (const r of rows) {
      let node = root; root.bytes += r.bytes;
      for (const frame of siteLines(r.site).slice().reverse()) {
        let child = node.children.get(frame);
        if (!child) { child = { name: frame, bytes: 0, children: new Map() }; node.children.set(frame, child); }
        child.bytes += r.bytes; node = child;
      }
    }
    icicleRoot = root; icicleFocus = root; drawIcicle();
  }
  let icicleRoot = null, icicleFocus = null, icicleRects = [];
  const icicle = $('icicle');
  function drawIcicle() {
    const dpr = devicePixelRatio, w = Math.max(600, $('sites-panel').clientWidth - 30), RH = 18;
    let depth = 0; (function d(n, k) { depth = Math.max(depth, k); for (const c of n.children.values()) d(c, k + 1); })(icicleFocus, 1);
    const h = depth * RH + 2;
    icicle.style.width = w + 'px'; icicle.style.height = h + 'px'; icicle.width = w * dpr; icicle.height = h * dpr;
    const ctx = icicle.getContext('2d'); ctx.scale(dpr, dpr); ctx.font = '11px sans-serif';
    icicleRects = [];
    const palette = ['#fdae6b', '#fd8d3c', '#fdd0a2', '#f16913', '#fee6ce'];
    (function draw(n, x, level, span) {
      if (span < 0.5) return;
      ctx.fillStyle = level === 0 ? '#bbb' : palette[(n.name.length + level) % palette.length];
      ctx.fillRect(x, level * RH, span - 0.5, RH - 1);
      icicleRects.push({ x, y: level * RH, w: span, node: n });
      if (span > 40) { ctx.fillStyle = '#000'; ctx.save(); ctx.beginPath(); ctx.rect(x, level * RH, span - 2, RH); ctx.clip(); ctx.fillText(n.name + ' (' + fmtBytes(n.bytes) + ')', x + 3, level * RH + 13); ctx.restore(); }
      let cx = x;
      for (const c of [...n.children.values()].sort((p, q) => q.bytes - p.bytes)) { const cw = n.bytes ? span * c.bytes / n.bytes : 0; draw(c, cx, level + 1, cw); cx += cw; }
    })(icicleFocus, 0, 0, w);
  }
  function icicleHit(ev) {
    const rect = icicle.getBoundingClientRect(), x = ev.clientX - rect.left, y = ev.clientY - rect.top;
    return icicleRects.find((r) => x >= r.x && x < r.x + r.w && y >= r.y && y < r.y + 18);
  }
  icicle.addEventListener('mousemove', (ev) => { const r = icicleHit(ev); if (!r) return hideTip(); showTip(ev, esc(r.node.name) + '<br>' + fmtBytes(r.node.bytes) + ' live' + (icicleRoot.bytes ? ', ' + (100 * r.node.bytes / icicleRoot.bytes).toFixed(1) + '%' : '') + '<br><i>click to zoom, click the top bar to go back</i>'); });
  icicle.addEventListener('mouseleave', hideTip);
  icicle.addEventListener('click', (ev) => { const r = icicleHit(ev); if (!r) return; icicleFocus = r.y === 0 ? icicleRoot : r.node; drawIcicle(); });

  // ---- sites allocated in the window, as `top --from A --to B` ------------
  function windowSites(a, b) {
    const bySite = new Map();
    const kept = (a === 0 && b >= N - 1) || N === 0 || detailOf(a, b);
    if (!kept) {
      report.windowSites = { from: a, to: b, sites: null };
      $('window-title').textContent = 'Sites allocated in events #' + a.toLocaleString('en') + ' to #' + b.toLocaleString('en') + ': not in this page';
      $('window-sites').innerHTML = '<tr><td>Event-level detail kept only for ' + esc(detailList()) + ': see <code>cachealloc-analyze top --from ' + a + ' --to ' + b + '</code>.</td></tr>';
      return;
    }
    if (a === 0 && b >= N - 1) {
      for (const [site, allocations, bytes] of meta.sites_whole_trace) bySite.set(site, { site, allocations, bytes });
    } else if (N > 0) {
      const cursor = new Cursor(keyframeFor(a));
      while (cursor.i <= b) {
        const i = cursor.i, e = cursor.next();
        if (i < a || e.kind !== K.alloc) continue;
        const site = siteOfStack(e.stack), s = bySite.get(site) || { site, allocations: 0, bytes: 0 };
        s.allocations += 1; s.bytes += e.size; bySite.set(site, s);
      }
    }
    const rows = [...bySite.values()].sort((x, y) => y.bytes - x.bytes || x.site - y.site);
    report.windowSites = { from: a, to: b, sites: rows.map((r) => ({ site: siteName(r.site), label: siteLabel(r.site), stack: siteLines(r.site), allocations: r.allocations, bytes: r.bytes })) };
    $('window-title').textContent = 'Sites allocated in events #' + a.toLocaleString('en') + ' to #' + b.toLocaleString('en') + ' (as top --from ' + a + ' --to ' + b + ')';
    $('window-sites').innerHTML = '<tr><th>#</th><th>allocations</th><th>allocated</th><th>site</th></tr>' + rows.slice(0, 20).map((r, i) =>
      '<tr><td class="num">' + (i + 1) + '</td><td class="num">' + r.allocations.toLocaleString('en') + '</td><td class="num">' + fmtBytes(r.bytes) + '</td>' + siteCell(r.site) + '</tr>').join('') +
      (rows.length > 20 ? '<tr><td colspan="4">' + (rows.length - 20) + ' more sites</td></tr>' : '');
  }

  function selectMoment(event) {
    report.moment = event;
    const layout = layoutAfter(event);
    $('segments-note').innerHTML = '';
    if (layout) {
      drawSegmentMap(layout, event);
      liveSites(layout, event);
    } else {
      layoutMissing(event);
    }
    timeline.redraw(false);
  }
  // Outside the detail windows: say so, clear the views, offer the nearest window.
  function layoutMissing(event) {
    if (event < RING_BEGINS) return beforeRing(event);
    const near = nearestDetail(event);
    report.segmentMap = { event, segments: null, nearest: near ? [near.window.from, near.window.to] : null };
    report.liveSites = null;
    canvas.style.height = '0px'; canvas.height = 0;
    const what = 'after event #' + event.toLocaleString('en');
    $('segments-title').textContent = 'Segment map ' + what + ': not in this page';
    $('segments-note').innerHTML = 'The layout ' + what + ' is not in this page: event-level detail kept only for ' + esc(detailList()) +
      ' (see <code>cachealloc-analyze segments --at ' + event + '</code>).' + (near ? ' Nearest: <a href="#" data-detail="' + details.indexOf(near.window) + '" data-event="' + near.event + '">event #' +
      near.event.toLocaleString('en') + ' in ' + evRange(near.window) + '</a>.' : '');
    $('live-title').textContent = 'Sites live ' + what + ': not in this page';
    $('live-sites').innerHTML = '';
    icicleRoot = icicleFocus = { name: 'not in this page', bytes: 0, children: new Map() }; drawIcicle();
  }
  // Before the ring's first memory event: no layout was recorded there.
  function beforeRing(event) {
    report.segmentMap = { event, segments: null, nearest: null, beforeRing: RING_BEGINS };
    report.liveSites = null;
    canvas.style.height = '0px'; canvas.height = 0;
    const what = 'after event #' + event.toLocaleString('en');
    $('segments-title').textContent = 'Segment map ' + what + ': not recorded';
    $('segments-note').innerHTML = 'The trace begins mid-run: before event #' + RING_BEGINS.toLocaleString('en') +
      ', the ring\'s first memory event of this device, no memory was recorded.';
    $('live-title').textContent = 'Sites live ' + what + ': not recorded';
    $('live-sites').innerHTML = '';
    icicleRoot = icicleFocus = { name: 'not recorded', bytes: 0, children: new Map() }; drawIcicle();
  }
  // A detail window's link: zoom to it and show the state there.
  document.addEventListener('click', (ev) => {
    const link = ev.target.closest && ev.target.closest('a[data-detail]');
    if (!link) return;
    ev.preventDefault();
    const w = details[Number(link.dataset.detail)];
    setView(w.from, w.to);
    selectMoment(link.dataset.event !== undefined ? Number(link.dataset.event) : nearestDetail(w.from).event);
  });


  // ---- what was live at the peak (as `cachealloc-analyze peak`) ------------
  function drawPeakPanel() {
    const p = peakOf('allocated');
    const event = p && p.event !== null && p.event !== undefined ? p.event : -1;
    const layout = layoutAfter(event);
    if (!layout) {  // the detail windows always hold the peak; a page without it says so
      $('peak-panel').innerHTML = '<h2>Live at the peak</h2><p>The state after event #' + event + ' is not in this page: see <code>cachealloc-analyze peak</code>.</p>';
      report.peakPanel = null;
      return;
    }
    const rows = liveBySite(layout), allocated = layout.allocated;
    const cats = CATS.map((c, k) => ({ key: c.key, label: c.label, inferred: c.inferred, bytes: layout.byCategory[k], k })).filter((c) => c.bytes > 0).sort((x, y) => y.bytes - x.bytes);
    const share = (bytes) => allocated ? (100 * bytes / allocated).toFixed(1) + '%' : '';
    let html = '<h2>Live at the peak: ' + fmtBytes(allocated) + ' allocated</h2><p class="sub">' + (event < 0 ? 'before the first event' : 'after event #' + event.toLocaleString('en')) +
      (p && p.phase ? ', phase ' + esc(p.phase) : '') + ' &middot; ' + rows.reduce((n, r) => n + r.blocks, 0).toLocaleString('en') + ' allocations in ' + rows.length + ' sites (as <code>cachealloc-analyze peak</code>)</p>';
    html += '<div class="stackbar">' + cats.map((c) => '<span style="width:' + (allocated ? 100 * c.bytes / allocated : 0) + '%;background:' + catColor(c.k) + '" title="' + esc(c.label) + ' ' + fmtBytes(c.bytes) + '"></span>').join('') + '</div>';
    html += '<h3>By category' + (cats.some((c) => c.inferred) ? ' <em class="inferred">inferred</em>' : '') + '</h3><table class="sites" id="peak-categories"><tr><th>category</th><th>bytes</th><th>share</th></tr>' +
      cats.map((c) => '<tr data-category="' + c.key + '"><td><span class="swatch" style="background:' + catColor(c.k) + '"></span>' + esc(c.label) + (c.inferred ? ' <em class="inferred">inferred</em>' : '') + '</td><td class="num">' + fmtBytes(c.bytes) + '</td><td class="num">' + share(c.bytes) + '</td></tr>').join('') + '</table>';
    html += '<h3>By site</h3><table class="sites" id="peak-sites"><tr><th>bytes</th><th>allocs</th><th>category</th><th>site</th></tr>' +
      rows.slice(0, 12).map((r) => '<tr><td class="num">' + fmtBytes(r.bytes) + '</td><td class="num">' + r.blocks + '</td><td class="cat">' + siteCategories(r) + '</td>' + siteCell(r.site) + '</tr>').join('') +
      (rows.length > 12 ? '<tr><td colspan="4">' + (rows.length - 12) + ' more sites: click the peak for all of them below</td></tr>' : '') + '</table>';
    $('peak-panel').innerHTML = html;
    report.peakPanel = { event: event < 0 ? null : event, allocated, categories: Object.fromEntries(CATS.map((c, k) => [c.key, layout.byCategory[k]])),
                         sites: rows.map((r) => ({ stack: siteLines(r.site), label: siteLabel(r.site), bytes: r.bytes, allocations: r.blocks })) };
  }
  // A site's stack on hover, in every table.
  document.addEventListener('mouseover', (ev) => {
    const cell = ev.target.closest && ev.target.closest('td.site-label');
    if (!cell) return;
    cell.removeAttribute('title');
    showTip(ev, siteLines(Number(cell.dataset.site)).map(esc).join('<br>'));
    cell.addEventListener('mouseleave', hideTip, { once: true });
  });
