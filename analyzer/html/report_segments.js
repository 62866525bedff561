// The cachealloc HTML report's page script, part: the segment map, each
// segment drawn to scale (its width proportional to its size, at least
// MIN_SEGMENT pixels), its label left-aligned in a column as wide as the widest.
// The parts (report_*.js, in the order assets.cmake lists them) share one
// function scope: report_data.js opens it, report_main.js closes it.
  // ---- segment map ---------------------------------------------------------
  const SEG_COLORS = { allocated: '#1f77b4', waste: '#ff9f1c', pending: '#9467bd', cached: '#b7dfb0', split: '#f4a6a6', unmapped: '#e6e6e6' };
  const SEG_LABELS = { allocated: 'allocated (requested bytes)', waste: 'rounding waste inside allocated blocks', pending: 'pending free (waits for other streams)',
                       cached: 'cached free', split: 'inactive split (free, in a segment still holding a block)', unmapped: 'unmapped expandable pages' };
  $('segment-legend').innerHTML = Object.keys(SEG_COLORS).map((k) => '<span><i style="background:' + SEG_COLORS[k] + '"></i>' + SEG_LABELS[k] + '</span>').join('');
  const canvas = $('segment-map');
  const ROW = 18, MIN_SEGMENT = 4, SEG_FONT = '11px monospace';
  function blockClass(b, seg, segHasActive) {
    if (b.state === ST.allocated) return 'allocated';
    if (b.state === ST.pending) return 'pending';
    if (b.state === ST.unmapped) return 'unmapped';
    return segHasActive && !(seg.flags & 2) ? 'split' : 'cached';
  }
  function drawSegmentMap(layout, event) {
    const segs = layout.sorted();
    const model = segs.map((seg) => {
      const blocks = [];
      let hasActive = false;
      for (let b = seg.first; b; b = b.next) if (b.state <= ST.pending) hasActive = true;
      let mapped = 0, allocated = 0;
      for (let b = seg.first; b; b = b.next) {
        blocks.push({ address: b.address, size: b.size, state: STATE_NAME[b.state], requested: b.state <= ST.pending ? b.requested : null,
                      site: b.state <= ST.pending ? siteName(siteOfStack(b.stack)) : null, stack: b.stack, cls: blockClass(b, seg, hasActive),
                      category: b.state <= ST.pending ? b.category : null });
        if (b.state !== ST.unmapped) mapped += b.size;
        if (b.state === ST.allocated) allocated += b.size;
      }
      return { address: seg.address, size: seg.total, reserved: mapped, allocated, pool: (seg.flags & 2) ? 'expandable' : (seg.flags & 1) ? 'large' : 'small', expandable: !!(seg.flags & 2), stream: seg.stream, blocks };
    });
    report.segmentMap = { event, segments: model };
    const dpr = devicePixelRatio, w = Math.max(600, $('segment-scroll').clientWidth - 4);
    canvas.style.width = w + 'px'; canvas.style.height = (model.length * ROW + 4) + 'px';
    canvas.width = w * dpr; canvas.height = (model.length * ROW + 4) * dpr;
    const ctx = canvas.getContext('2d');
    ctx.scale(dpr, dpr);
    ctx.font = SEG_FONT;
    const labelOf = (seg) => hex(seg.address) + ' ' + fmtBytes(seg.size) + ' ' + seg.pool;
    const LABEL = Math.ceil(Math.max(0, ...model.map((seg) => ctx.measureText(labelOf(seg)).width))) + 10;
    const fullW = w - LABEL - 4, largest = Math.max(1, ...model.map((seg) => seg.size));
    report.segmentMap.labelWidth = LABEL;
    model.forEach((seg, row) => {
      const y = row * ROW + 2;
      ctx.fillStyle = '#333';
      ctx.fillText(labelOf(seg), 2, y + 12);
      const barW = seg.width = Math.max(MIN_SEGMENT, fullW * seg.size / largest);
      seg.labelEnd = 2 + ctx.measureText(labelOf(seg)).width;
      for (const b of seg.blocks) {
        const x0 = LABEL + (b.address - seg.address) / seg.size * barW, x1 = LABEL + (b.address + b.size - seg.address) / seg.size * barW;
        const bw = Math.max(1, x1 - x0);
        b.x0 = x0; b.x1 = x0 + bw; b.row = row;
        ctx.fillStyle = SEG_COLORS[b.cls];
        ctx.fillRect(x0, y, bw, ROW - 4);
        if (b.cls === 'allocated' && b.requested !== null && b.size > b.requested) {
          const xr = x0 + bw * (b.requested / b.size);
          ctx.fillStyle = SEG_COLORS.waste; ctx.fillRect(xr, y, Math.max(0.5, x0 + bw - xr), ROW - 4);
        }
        if (bw > 3) { ctx.fillStyle = '#fff'; ctx.fillRect(x0 + bw - 0.5, y, 0.5, ROW - 4); }
      }
    });
    $('segments-title').textContent = (event < 0 ? 'Segment map before the first event' : 'Segment map after event #' + event.toLocaleString('en')) + ' \u2014 ' + model.length + ' segments, ' +
      model.reduce((n, s) => n + s.blocks.length, 0).toLocaleString('en') + ' blocks (as segments --at ' + event + ')';
  }
  canvas.addEventListener('mousemove', (ev) => {
    const m = report.segmentMap; if (!m || !m.segments) return;
    const rect = canvas.getBoundingClientRect(), x = ev.clientX - rect.left, row = Math.floor((ev.clientY - rect.top - 2) / ROW);
    const seg = m.segments[row]; if (!seg) return hideTip();
    let hit = null;
    for (const b of seg.blocks) if (x >= b.x0 - 0.5 && x <= b.x1 + 0.5) { hit = b; if (x <= b.x1) break; }
    if (!hit) return showTip(ev, '<b>segment ' + hex(seg.address) + '</b><br>' + fmtBytes(seg.size) + ', ' + seg.blocks.length + ' blocks');
    let html = '<b>' + esc(SEG_LABELS[hit.cls]) + '</b><br>block ' + hex(hit.address) + ' (offset ' + fmtBytes(hit.address - seg.address) + ')<br>size ' + fmtBytes(hit.size);
    if (hit.requested !== null) html += ', requested ' + fmtBytes(hit.requested) + ', rounding ' + fmtBytes(hit.size - hit.requested);
    if (hit.category !== null) html += '<br>category ' + esc(catName(hit.category));
    if (hit.site) html += '<br><br>' + siteLines(siteOfStack(hit.stack)).map(esc).join('<br>');
    html += '<br><br><i>segment ' + hex(seg.address) + ', ' + fmtBytes(seg.size) + ', ' + seg.pool + (seg.expandable ? '' : ' pool') + '</i>';
    showTip(ev, html);
  });
  canvas.addEventListener('mouseleave', hideTip);

