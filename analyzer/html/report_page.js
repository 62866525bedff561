// The cachealloc HTML report's page script, part: the page skeleton, tooltip and summary.
// The parts (report_*.js, in the order assets.cmake lists them) share one
// function scope: report_data.js opens it, report_main.js closes it.
  // ---- page ----------------------------------------------------------------
  const app = $('app');
  app.innerHTML = '';
  const oomCount = (oom.ooms || []).length;
  const headline = (summary.peaks || []).filter((p) => p.metric === 'allocated' || p.metric === 'reserved')
    .map((p) => 'peak ' + esc(p.metric) + ' ' + fmtBytes(p.bytes)).join(' &middot; ');
  // The first screen: the timeline and, beside it, what was live at the peak.
  app.append(
    el('header', {}, '<h1>cachealloc memory report</h1><p class="sub">' + esc(meta.title) + ' &middot; ' + N.toLocaleString('en') + ' events' +
      (headline ? ' &middot; ' + headline : '') + (oomCount ? ' &middot; <a href="#summary" class="oom-count">' + oomCount + ' out-of-memory errors</a>' : '') + '</p>'),
    el('div', { id: 'first-screen' }),
    el('section', { id: 'segments-panel', className: 'panel' }, '<h2 id="segments-title">Segment map</h2><p id="segments-note" class="notice"></p><div id="segment-legend" class="legend"></div><div id="segment-scroll"><canvas id="segment-map"></canvas></div>'),
    el('section', { id: 'sites-panel', className: 'panel' },
      '<h2 id="live-title">Sites live</h2><canvas id="icicle"></canvas><table id="live-sites" class="sites"></table>' +
      '<h2 id="window-title">Sites allocated in the window</h2><table id="window-sites" class="sites"></table>'),
    el('section', { id: 'summary', className: 'panel' }),
    el('section', { id: 'fragmentation-panel', className: 'panel' }, '<h2>Fragmentation over time</h2><div id="fragmentation"></div>'),
    el('div', { id: 'tooltip' }));
  $('first-screen').append(
    el('section', { id: 'timeline-panel', className: 'panel' },
      '<h2>Memory over time, allocated by category</h2><div class="controls">x axis: <label><input type="radio" name="xmode" value="event" checked> event index</label> ' +
      '<label><input type="radio" name="xmode" value="time"> time</label> &middot; <button id="pan-left" title="pan left">&#9664;</button>' +
      '<button id="pan-right" title="pan right">&#9654;</button> <button id="zoom-out">zoom out</button> <button id="reset">whole run</button>' +
      ' <span id="window-label"></span></div>' +
      '<p class="hint">Hover a band for its top sites and stack; drag to zoom into a window (and list the sites allocated in it), wheel to zoom, shift+wheel to pan, click for the state at an event, double-click for the whole run.</p>' +
      '<div id="timeline-box"><div id="timeline"></div><div id="timeline-labels"></div></div><div id="markers"></div><div id="timeline-legend" class="legend"></div>' +
      '<p id="detail-note" class="notice"></p>' + (wholeDetail || N === 0 ? '' : '<p id="detail-windows" class="sub">This trace has more events than the page keeps event by event (' +
      meta.detail_budget.toLocaleString('en') + '): the timeline covers the whole run; the segment map, the sites and event-by-event zoom cover ' +
      details.map((w, i) => '<a href="#" data-detail="' + i + '">' + evRange(w) + '</a> (' + esc(w.why.join(', ')) + ')').join('; ') +
      '. Outside them the phases strip leaves out phases shorter than ' + meta.bucket_events.toLocaleString('en') + ' events.</p>')),
    el('section', { id: 'peak-panel', className: 'panel' }));
  const tooltip = $('tooltip');
  // Beside the cursor, on the side with room, so the tip never leaves the window.
  function showTip(ev, html) {
    tooltip.innerHTML = html; tooltip.style.display = 'block';
    const w = tooltip.offsetWidth, h = tooltip.offsetHeight;
    const left = ev.clientX + 14 + w > innerWidth ? ev.pageX - 14 - w : ev.pageX + 14;
    const top = ev.clientY + 14 + h > innerHeight ? Math.max(scrollY, ev.pageY - 14 - h) : ev.pageY + 14;
    tooltip.style.left = Math.max(0, left) + 'px'; tooltip.style.top = top + 'px';
  }
  function hideTip() { tooltip.style.display = 'none'; }

  // ---- summary -----------------------------------------------------------
  {
    const g = summary.gap || {};
    const chain = [['allocated', g.allocated], ['+ pending frees', g.pending_free], ['+ cached free', g.cached_free], ['= reserved', g.reserved],
                   ['+ this process outside the allocator', g.process_outside_allocator], ['= this process (NVML)', g.process_used],
                   ['+ other processes', g.other_processes_used], ['= device used', g.device_used], ['device total', g.device_total]];
    let html = '<h2>At the end of the trace <span class="sub">(as <code>cachealloc-analyze summary</code>, after event #' + esc(summary.at_event) + ')</span></h2><div class="cols"><table class="figures"><tr><th colspan="2">From allocated to the device</th></tr>';
    for (const [label, v] of chain) if (v !== null && v !== undefined) html += '<tr><td>' + esc(label) + '</td><td class="num">' + fmtBytes(v) + '</td></tr>';
    html += '<tr><td>rounding waste (inside active blocks)</td><td class="num">' + fmtBytes(g.rounding_waste) + '</td></tr>';
    html += '<tr><td>releasable by empty_cache()</td><td class="num">' + fmtBytes(g.releasable_by_empty_cache) + '</td></tr></table>';
    html += '<table class="figures" id="peaks"><tr><th>peak</th><th>bytes</th><th>after event</th><th>phase</th></tr>';
    for (const p of summary.peaks || []) html += '<tr><td>' + esc(p.metric) + '</td><td class="num" data-metric="' + esc(p.metric) + '" data-bytes="' + p.bytes + '">' + fmtBytes(p.bytes) + '</td><td class="num">' + (p.event === null ? 'start' : '#' + p.event) + '</td><td>' + esc(p.phase || '') + '</td></tr>';
    html += '</table></div>';
    if (summary.fragmentation) html += '<p>' + esc(summary.fragmentation.headline) + '</p>';
    if (oom.ooms && oom.ooms.length) {
      const lines = oom.explanation || [];
      html += '<div class="oom"><h3>Out of memory: ' + oom.ooms.length + ' (as <code>cachealloc-analyze oom</code>)</h3><ul>' +
        lines.slice(0, 3).map((l) => '<li>' + esc(l) + '</li>').join('') + '</ul>';
      if (lines.length > 3) html += '<details><summary>' + (lines.length - 3) + ' more</summary><ul>' + lines.slice(3).map((l) => '<li>' + esc(l) + '</li>').join('') + '</ul></details>';
      html += '</div>';
    }
    const notes = (summary.notes || []).concat(summary.lower_bounds && summary.lower_bounds.length ? ['lower bounds: ' + summary.lower_bounds.join(', ')] : [])
      .concat(summary.approximate && summary.approximate.length ? ['approximate (events were dropped): ' + summary.approximate.join(', ')] : []);
    if (notes.length) html += '<ul class="notes">' + notes.map((n) => '<li>' + esc(n) + '</li>').join('') + '</ul>';
    $('summary').innerHTML = html;
  }
  const peakOf = (metric) => (summary.peaks || []).find((p) => p.metric === metric);

  // ---- state shared by the views ----------------------------------------
  const report = window.cacheallocReport = { ready: false, view: [0, Math.max(0, N - 1)], moment: null, segmentMap: null, liveSites: null, windowSites: null, timelinePeak: null };
  let xmode = 'event';
  let current = null;  // the series drawn now

