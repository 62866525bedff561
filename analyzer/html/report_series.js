// The cachealloc HTML report's page script, part: the timeline's series: exact or from level-of-detail buckets.
// The parts (report_*.js, in the order assets.cmake lists them) share one
// function scope: report_data.js opens it, report_main.js closes it.
  // ---- level-of-detail buckets ------------------------------------------
  const W0 = meta.bucket_events;
  const levels = [];
  {
    const B = meta.buckets, r = new Reader(bucketBytes);
    const l = { width: W0, t: new Float64Array(B), amin: new Float64Array(B), amax: new Float64Array(B),
                rmin: new Float64Array(B), rmax: new Float64Array(B), cmin: new Float64Array(B), cmax: new Float64Array(B) };
    const prev = [0, 0, 0, 0, 0, 0, 0], keys = ['t', 'amin', 'amax', 'rmin', 'rmax', 'cmin', 'cmax'];
    for (let b = 0; b < B; ++b) for (let k = 0; k < 7; ++k) { prev[k] += r.s(); l[keys[k]][b] = prev[k]; }
    // Per bucket, allocated by category where allocated peaked in it (they
    // add up to amax): a coarser bucket takes its finer bucket of largest amax.
    l.cats = CATS.map(() => new Float64Array(B));
    const rc = new Reader(bucketCategoryBytes), prevCat = CATS.map(() => 0);
    for (let b = 0; b < B; ++b) for (let k = 0; k < CATS.length; ++k) { prevCat[k] += rc.s(); l.cats[k][b] = prevCat[k]; }
    levels.push(l);
    while (levels[levels.length - 1].t.length > 1000) {
      const f = levels[levels.length - 1], n = Math.ceil(f.t.length / 4);
      const c = { width: f.width * 4, cats: CATS.map(() => new Float64Array(n)) };
      for (const k of keys) c[k] = new Float64Array(n);
      for (let b = 0; b < n; ++b) {
        const lo = b * 4, hi = Math.min(lo + 4, f.t.length);
        c.t[b] = f.t[lo];
        for (const k of ['amin', 'rmin', 'cmin']) { let v = Infinity; for (let j = lo; j < hi; ++j) v = Math.min(v, f[k][j]); c[k][b] = v; }
        for (const k of ['amax', 'rmax', 'cmax']) { let v = 0; for (let j = lo; j < hi; ++j) v = Math.max(v, f[k][j]); c[k][b] = v; }
        let top = lo;
        for (let j = lo + 1; j < hi; ++j) if (f.amax[j] > f.amax[top]) top = j;
        for (let k = 0; k < CATS.length; ++k) c.cats[k][b] = f.cats[k][top];
      }
      levels.push(c);
    }
  }
  const exactLimit = meta.exact_events;
  // Points for the events [from, to]: exact below the limit inside a detail
  // window, else the finest level with at most ~2,000 buckets in the window.
  function seriesFor(from, to) {
    const count = to - from + 1;
    if ((count <= exactLimit && detailOf(from, to)) || levels[0].t.length === 0) {
      const s = exactSeries(from, to);
      return { exact: true, ev: s.ev, t: s.t, amax: s.a, amin: s.a, rmax: s.r, cmax: s.c, cats: s.cats };
    }
    let l = levels[0];
    for (const candidate of levels) { l = candidate; if (count / candidate.width <= 2000) break; }
    const b0 = Math.floor(from / l.width), b1 = Math.min(l.t.length - 1, Math.floor(to / l.width));
    const n = b1 - b0 + 1, ev = new Float64Array(n);
    for (let b = 0; b < n; ++b) ev[b] = (b0 + b) * l.width;
    return { exact: false, width: l.width, ev, t: l.t.slice(b0, b1 + 1), amax: l.amax.slice(b0, b1 + 1), amin: l.amin.slice(b0, b1 + 1),
             rmax: l.rmax.slice(b0, b1 + 1), cmax: l.cmax.slice(b0, b1 + 1), cats: l.cats.map((c) => c.slice(b0, b1 + 1)) };
  }
  // The first event of [from, to] where allocated is largest; null where
  // the events that decide it are not in the page.
  function peakIn(from, to) {
    let best = -1, bestBytes = -1;
    if (to - from + 1 > exactLimit * 4) {
      const l = levels[0];
      let bb = -1, bv = -1;
      for (let b = Math.floor(from / l.width); b <= Math.min(l.t.length - 1, Math.floor(to / l.width)); ++b) if (l.amax[b] > bv) { bv = l.amax[b]; bb = b; }
      from = Math.max(from, bb * l.width); to = Math.min(to, bb * l.width + l.width - 1);
    }
    if (!detailOf(from, to)) return null;
    const s = exactSeries(from, to);
    for (let j = 0; j < s.a.length; ++j) if (s.a[j] > bestBytes) { bestBytes = s.a[j]; best = s.ev[j]; }
    return best;
  }

  // ---- names -------------------------------------------------------------
  const siteLines = (site) => meta.sites[site] || ['<unknown site>'];
  const siteOfStack = (stack) => meta.stack_site[stack] !== undefined ? meta.stack_site[stack] : 0;
  const siteName = (site) => siteLines(site)[0] || '<unknown site>';
  // What the tables print for a site: its first frame with the file's base
  // name ("forward (model.py:42)"). Sites whose labels would be the same get
  // their caller, then a short id, so that no two look
  // alike; the full stack is on hover.
  const shortFrame = (line) => line.replace(/\(([^()]*\/)([^/()]+)\)$/, '($2)');
  const siteLabel = (() => {
    const labels = meta.sites.map((lines) => shortFrame(lines[0] || '<unknown site>'));
    const refine = (make) => {
      const count = new Map();
      for (const l of labels) count.set(l, (count.get(l) || 0) + 1);
      labels.forEach((l, site) => { if (count.get(l) > 1) labels[site] = make(site, l); });
    };
    refine((site, l) => meta.sites[site].length > 1 ? l + ' \u2190 ' + shortFrame(meta.sites[site][1]) : l);
    refine((site, l) => l + ' [site ' + site + ']');
    return (site) => labels[site] !== undefined ? labels[site] : '<unknown site>';
  })();

