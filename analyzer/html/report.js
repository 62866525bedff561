// The cachealloc HTML report's page script (inlined by cachealloc-analyze html).
// Data comes from the analyzer (analyzer/src/render/html_report.cpp, which documents
// the columns); the page only decodes, replays from the nearest keyframe, and
// draws. uPlot draws the two charts; the segment map and the icicle are ours.
(async function () {
  'use strict';
  const $ = (id) => document.getElementById(id);
  const timings = {}, t0 = performance.now();
  const mark = (name) => { timings[name] = Math.round(performance.now() - t0); };
  const K = { alloc: 0, free_requested: 1, free_completed: 2, segment_alloc: 5, segment_release: 6,
              segment_map: 7, segment_unmap: 8, empty_cache: 9, oom: 10, annotation_begin: 11,
              annotation_end: 12, other: 15 };
  const ST = { allocated: 0, pending: 1, inactive: 2, unmapped: 3 };
  const STATE_NAME = ['active_allocated', 'active_pending_free', 'inactive', 'unmapped'];

  // ---- payloads --------------------------------------------------------
  async function bytesOf(id) {
    const text = $(id).textContent;
    let packed;
    if (typeof Uint8Array.fromBase64 === 'function') {
      packed = Uint8Array.fromBase64(text);
    } else {
      const raw = atob(text);
      packed = new Uint8Array(raw.length);
      for (let i = 0; i < raw.length; ++i) packed[i] = raw.charCodeAt(i);
    }
    const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream('gzip'));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }
  async function jsonOf(id) { return JSON.parse(new TextDecoder().decode(await bytesOf(id))); }

  class Reader {
    constructor(bytes, at) { this.b = bytes; this.p = at || 0; }
    u() { let r = 0, m = 1, x; do { x = this.b[this.p++]; r += (x & 127) * m; m *= 128; } while (x & 128); return r; }
    s() { const v = this.u(); return v % 2 ? -(v + 1) / 2 : v / 2; }
  }
  const [meta, summary, oom, fragmentation, annotations, markers] = await Promise.all(
    ['data-meta', 'data-summary', 'data-oom', 'data-fragmentation', 'data-annotations', 'data-markers'].map(jsonOf));
  const [kinds, addresses, sizes, auxes, stacks, streams, times, bucketBytes, keyframeBytes] = await Promise.all(
    ['data-kinds', 'data-addresses', 'data-sizes', 'data-auxes', 'data-stacks', 'data-streams', 'data-times',
     'data-buckets', 'data-keyframes'].map(bytesOf));
  const N = meta.events;
  mark('decoded');

  // ---- formatting --------------------------------------------------------
  function fmtBytes(b) {
    if (b === null || b === undefined) return 'unknown';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let v = Math.abs(b), u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; ++u; }
    return (b < 0 ? '-' : '') + (u === 0 ? String(v) : v.toFixed(2)) + ' ' + units[u];
  }
  function fmtTime(ns) { return '+' + (ns / 1e9).toFixed(6) + 's'; }
  function hex(a) { return '0x' + a.toString(16); }
  function esc(s) { return String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]); }
  function el(tag, attrs, html) { const e = document.createElement(tag); Object.assign(e, attrs || {}); if (html !== undefined) e.innerHTML = html; return e; }

  // ---- keyframes ---------------------------------------------------------
  // Each: the event it precedes, its byte offset, the delta bases, and the
  // byte offsets of the event columns there (html_report.cpp writes them).
  const keyframes = meta.keyframe_index.map((k) => ({ before: k[0], at: k[1], addressBase: k[2], timeBase: k[3], off: k.slice(4) }));
  mark('indexed');
  function keyframeFor(event) {  // the last keyframe at or before `event`
    let lo = 0, hi = keyframes.length - 1;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (keyframes[mid].before <= event) lo = mid; else hi = mid - 1; }
    return keyframes[lo];
  }

  // Decodes events from a keyframe on, in order.
  class Cursor {
    constructor(frame) {
      this.i = frame.before;
      this.ra = new Reader(addresses, frame.off[0]); this.rs = new Reader(sizes, frame.off[1]);
      this.rx = new Reader(auxes, frame.off[2]); this.rk = new Reader(stacks, frame.off[3]);
      this.rr = new Reader(streams, frame.off[4]); this.rt = new Reader(times, frame.off[5]);
      this.address = frame.addressBase; this.time = frame.timeBase;
      this.e = { kind: 0, address: 0, size: 0, aux: 0, stack: 0, stream: 0, time: 0 };
    }
    next() {
      const e = this.e, kind = kinds[this.i++];
      e.kind = kind;
      this.time += this.rt.s(); e.time = this.time;
      if (kind === K.alloc) {
        this.address += this.ra.s(); e.address = this.address; e.size = this.rs.u(); e.aux = e.size - this.rx.s(); e.stack = this.rk.u();
      } else if (kind === K.segment_alloc || kind === K.segment_map) {
        this.address += this.ra.s(); e.address = this.address; e.size = this.rs.u(); e.aux = this.rx.u(); e.stack = this.rk.u(); e.stream = this.rr.u();
      } else if (kind === K.segment_unmap) {
        this.address += this.ra.s(); e.address = this.address; e.size = this.rs.u();
      } else if (kind === K.free_requested || kind === K.free_completed || kind === K.segment_release) {
        this.address += this.ra.s(); e.address = this.address;
      }
      return e;
    }
  }

  // ---- the layout replay (analyzer/src/core/replay.cpp's rules, blocks only) ----
  class Layout {
    constructor(frame) {
      this.blocks = new Map(); this.segs = [];
      this.allocated = 0; this.active = 0; this.reserved = 0;
      const r = new Reader(keyframeBytes, frame.at);
      r.u(); r.u(); r.u();
      const count = r.u();
      let address = 0;
      for (let s = 0; s < count; ++s) {
        address += r.s();
        const seg = { address, total: r.u(), stream: r.u(), flags: r.u(), stack: r.u(), first: null, mapped: 0, live: true };
        this.segs.push(seg);
        const n = r.u();
        let at = address, prev = null;
        for (let b = 0; b < n; ++b) {
          const blk = { address: at, size: r.u(), state: r.u(), requested: 0, stack: 0, seg, prev, next: null };
          if (blk.state <= ST.pending) { blk.requested = blk.size - r.s(); blk.stack = r.u(); }
          if (prev) prev.next = blk; else seg.first = blk;
          prev = blk; at += blk.size;
          this.blocks.set(blk.address, blk);
          if (blk.state !== ST.unmapped) seg.mapped += blk.size;
          if (blk.state === ST.allocated) this.allocated += blk.size;
          if (blk.state <= ST.pending) this.active += blk.size;
        }
        this.reserved += seg.mapped;
      }
      this.lastSeg = null;
    }
    containing(address) {
      const s = this.lastSeg;
      if (s && s.live && address >= s.address && address - s.address < s.total) return s;
      for (const seg of this.segs) if (address >= seg.address && address - seg.address < seg.total) return (this.lastSeg = seg);
      return null;
    }
    split(blk, at) {
      const tail = { address: at, size: blk.address + blk.size - at, state: blk.state, requested: 0, stack: 0, seg: blk.seg, prev: blk, next: blk.next };
      blk.size = at - blk.address;
      if (blk.next) blk.next.prev = tail;
      blk.next = tail;
      this.blocks.set(at, tail);
      return tail;
    }
    isolate(seg, address, size, expected) {
      let b = seg.first;
      while (b && b.address + b.size <= address) b = b.next;
      if (!b || b.address > address || b.state !== expected || address + size > b.address + b.size) return null;
      if (b.address < address) b = this.split(b, address);
      if (b.size > size) this.split(b, address + size);
      return b;
    }
    coalesce(b) {
      const n = b.next;
      if (n && n.state === b.state) { b.size += n.size; b.next = n.next; if (b.next) b.next.prev = b; this.blocks.delete(n.address); }
      const p = b.prev;
      if (p && p.state === b.state) { p.size += b.size; p.next = b.next; if (b.next) b.next.prev = p; this.blocks.delete(b.address); return p; }
      return b;
    }
    apply(e) {
      switch (e.kind) {
        case K.alloc: {
          let b = this.blocks.get(e.address);
          let size = e.size;
          if (b && b.state === ST.inactive && b.size >= e.size) {
            // A large-pool tail of 1 MiB or less stays with the block where
            // the file's sizes may be inferred (Replay::on_alloc's rule).
            if (b.size > e.size) {
              if (meta.inferred_sizes && (b.seg.flags & 1) && !(b.seg.flags & 2) && b.size - e.size <= 1048576) size = b.size;
              else this.split(b, e.address + e.size);
            }
          } else {
            if (b && b.state <= ST.pending) return;
            const seg = b ? b.seg : this.containing(e.address);
            b = seg ? this.isolate(seg, e.address, e.size, ST.inactive) : null;
            if (!b) return;
          }
          b.state = ST.allocated; b.requested = e.aux; b.stack = e.stack;
          this.allocated += size; this.active += size;
          return;
        }
        case K.free_requested: {
          const b = this.blocks.get(e.address);
          if (!b || b.state !== ST.allocated) return;
          b.state = ST.pending; this.allocated -= b.size;
          return;
        }
        case K.free_completed: {
          const b = this.blocks.get(e.address);
          if (!b || b.state > ST.pending) return;
          if (b.state === ST.allocated) this.allocated -= b.size;
          b.state = ST.inactive; b.requested = 0; b.stack = 0;
          this.active -= b.size;
          this.coalesce(b);
          return;
        }
        case K.segment_alloc: this.segmentAlloc(e.address, e.size, e.stream, e.aux, e.stack, (e.aux & 2) !== 0); return;
        case K.segment_release: this.segmentRelease(e.address); return;
        case K.segment_map: {
          let seg = this.containing(e.address);
          if (!seg) {
            for (const s of this.segs) if (s.address + s.total === e.address) seg = s;
            if (!seg) {
              const flagged = (e.aux & 2) !== 0, large = !flagged || (e.aux & 1) !== 0;
              this.segmentAlloc(e.address, e.size, e.stream, (large ? 1 : 0) | 2, e.stack, true);
              return;
            }
            let last = seg.first;
            while (last.next) last = last.next;
            const b = { address: e.address, size: e.size, state: ST.inactive, requested: 0, stack: 0, seg, prev: last, next: null };
            last.next = b; this.blocks.set(b.address, b);
            seg.total += e.size; seg.mapped += e.size; this.reserved += e.size;
            this.coalesce(b);
            return;
          }
          const b = this.isolate(seg, e.address, e.size, ST.unmapped);
          if (!b) return;
          b.state = ST.inactive; seg.mapped += e.size; this.reserved += e.size;
          this.coalesce(b);
          return;
        }
        case K.segment_unmap: {
          const seg = this.containing(e.address);
          const b = seg ? this.isolate(seg, e.address, e.size, ST.inactive) : null;
          if (!b) return;
          b.state = ST.unmapped; seg.mapped -= e.size; this.reserved -= e.size;
          this.coalesce(b);
          return;
        }
        default: return;
      }
    }
    segmentAlloc(address, size, stream, aux, stack, expandable) {
      if (this.segs.some((s) => s.address === address)) this.segmentRelease(address);
      if (size === 0) return;
      const seg = { address, total: size, stream, flags: ((aux & 1) ? 1 : 0) | (expandable ? 2 : 0), stack, first: null, mapped: size, live: true };
      const b = { address, size, state: ST.inactive, requested: 0, stack: 0, seg, prev: null, next: null };
      seg.first = b; this.blocks.set(address, b);
      this.segs.push(seg);
      this.reserved += size;
    }
    segmentRelease(address) {
      const at = this.segs.findIndex((s) => s.address === address);
      if (at < 0) return;
      const seg = this.segs[at];
      for (let b = seg.first; b; b = b.next) {
        if (b.state === ST.allocated) this.allocated -= b.size;
        if (b.state <= ST.pending) this.active -= b.size;
        this.blocks.delete(b.address);
      }
      this.reserved -= seg.mapped; seg.live = false;
      this.segs.splice(at, 1);
      if (this.lastSeg === seg) this.lastSeg = null;
    }
    sorted() { return this.segs.slice().sort((a, b) => a.address - b.address); }
  }
  // The layout just after event `event` (-1: before the first).
  // The layout after `event`. A free no stream waited on is one call in
  // PyTorch: a free_requested followed by its own free_completed settles
  // with it, as the CLI's --at and --to do (no pending free between them).
  function layoutAfter(event) {
    // A keyframe before `event` itself (not only before event + 1): the
    // settling needs the event's own address.
    const frame = keyframeFor(kinds[event] === K.free_requested ? event : event + 1);
    const layout = new Layout(frame), cursor = new Cursor(frame);
    let lastKind = -1, lastAddress = 0;
    while (cursor.i <= event && cursor.i < N) {
      const e = cursor.next();  // the cursor's one event object, refilled by each next()
      layout.apply(e);
      lastKind = e.kind; lastAddress = e.address;
    }
    if (lastKind === K.free_requested && cursor.i < N) {
      const next = cursor.next();
      if (next.kind === K.free_completed && next.address === lastAddress) layout.apply(next);
    }
    return layout;
  }
  // Per-event totals and times over [from, to] (inclusive), exact.
  function exactSeries(from, to) {
    const frame = keyframeFor(from);
    const layout = new Layout(frame), cursor = new Cursor(frame);
    const n = to - from + 1;
    const out = { ev: new Float64Array(n), t: new Float64Array(n), a: new Float64Array(n), r: new Float64Array(n), c: new Float64Array(n) };
    while (cursor.i <= to) {
      const i = cursor.i, e = cursor.next();
      layout.apply(e);
      if (i >= from) { const j = i - from; out.ev[j] = i; out.t[j] = e.time; out.a[j] = layout.allocated; out.r[j] = layout.reserved; out.c[j] = layout.active; }
    }
    return out;
  }

  // ---- level-of-detail buckets ------------------------------------------
  const W0 = meta.bucket_events;
  const levels = [];
  {
    const B = meta.buckets, r = new Reader(bucketBytes);
    const l = { width: W0, t: new Float64Array(B), amin: new Float64Array(B), amax: new Float64Array(B),
                rmin: new Float64Array(B), rmax: new Float64Array(B), cmin: new Float64Array(B), cmax: new Float64Array(B) };
    const prev = [0, 0, 0, 0, 0, 0, 0], keys = ['t', 'amin', 'amax', 'rmin', 'rmax', 'cmin', 'cmax'];
    for (let b = 0; b < B; ++b) for (let k = 0; k < 7; ++k) { prev[k] += r.s(); l[keys[k]][b] = prev[k]; }
    levels.push(l);
    while (levels[levels.length - 1].t.length > 1000) {
      const f = levels[levels.length - 1], n = Math.ceil(f.t.length / 4);
      const c = { width: f.width * 4 };
      for (const k of keys) c[k] = new Float64Array(n);
      for (let b = 0; b < n; ++b) {
        const lo = b * 4, hi = Math.min(lo + 4, f.t.length);
        c.t[b] = f.t[lo];
        for (const k of ['amin', 'rmin', 'cmin']) { let v = Infinity; for (let j = lo; j < hi; ++j) v = Math.min(v, f[k][j]); c[k][b] = v; }
        for (const k of ['amax', 'rmax', 'cmax']) { let v = 0; for (let j = lo; j < hi; ++j) v = Math.max(v, f[k][j]); c[k][b] = v; }
      }
      levels.push(c);
    }
  }
  const exactLimit = meta.exact_events;
  // Points for the events [from, to]: exact below the limit, else the finest
  // level with at most ~2,000 buckets in the window.
  function seriesFor(from, to) {
    const count = to - from + 1;
    if (count <= exactLimit || levels[0].t.length === 0) {
      const s = exactSeries(from, to);
      return { exact: true, ev: s.ev, t: s.t, amax: s.a, amin: s.a, rmax: s.r, cmax: s.c };
    }
    let l = levels[0];
    for (const candidate of levels) { l = candidate; if (count / candidate.width <= 2000) break; }
    const b0 = Math.floor(from / l.width), b1 = Math.min(l.t.length - 1, Math.floor(to / l.width));
    const n = b1 - b0 + 1, ev = new Float64Array(n);
    for (let b = 0; b < n; ++b) ev[b] = (b0 + b) * l.width;
    return { exact: false, width: l.width, ev, t: l.t.slice(b0, b1 + 1), amax: l.amax.slice(b0, b1 + 1), amin: l.amin.slice(b0, b1 + 1),
             rmax: l.rmax.slice(b0, b1 + 1), cmax: l.cmax.slice(b0, b1 + 1) };
  }
  // The first event of [from, to] where allocated is largest.
  function peakIn(from, to) {
    let best = -1, bestBytes = -1;
    if (to - from + 1 > exactLimit * 4) {
      const l = levels[0];
      let bb = -1, bv = -1;
      for (let b = Math.floor(from / l.width); b <= Math.min(l.t.length - 1, Math.floor(to / l.width)); ++b) if (l.amax[b] > bv) { bv = l.amax[b]; bb = b; }
      from = Math.max(from, bb * l.width); to = Math.min(to, bb * l.width + l.width - 1);
    }
    const s = exactSeries(from, to);
    for (let j = 0; j < s.a.length; ++j) if (s.a[j] > bestBytes) { bestBytes = s.a[j]; best = s.ev[j]; }
    return best;
  }

  // ---- names -------------------------------------------------------------
  const siteLines = (site) => meta.sites[site] || ['<unknown site>'];
  const siteOfStack = (stack) => meta.stack_site[stack] !== undefined ? meta.stack_site[stack] : 0;
  const siteName = (site) => siteLines(site)[0] || '<unknown site>';

  // ---- page ----------------------------------------------------------------
  const app = $('app');
  app.innerHTML = '';
  app.append(
    el('header', {}, '<h1>cachealloc memory report</h1><p class="sub">' + esc(meta.title) + ' &middot; ' + N.toLocaleString('en') + ' events</p>'),
    el('section', { id: 'summary', className: 'panel' }),
    el('section', { id: 'timeline-panel', className: 'panel' },
      '<h2>Memory over time</h2><div class="controls">x axis: <label><input type="radio" name="xmode" value="event" checked> event index</label> ' +
      '<label><input type="radio" name="xmode" value="time"> time</label> &middot; <button id="pan-left" title="pan left">&#9664;</button>' +
      '<button id="pan-right" title="pan right">&#9654;</button> <button id="zoom-out">zoom out</button> <button id="reset">whole run</button>' +
      ' <span id="window-label"></span></div>' +
      '<p class="hint">Drag to select a window (zoom and sites allocated in it), wheel to zoom, shift+wheel to pan, click for the state at an event, double-click for the whole run.</p>' +
      '<div id="timeline"></div><div id="timeline-legend" class="legend"></div>'),
    el('section', { id: 'segments-panel', className: 'panel' }, '<h2 id="segments-title">Segment map</h2><div id="segment-legend" class="legend"></div><div id="segment-scroll"><canvas id="segment-map"></canvas></div>'),
    el('section', { id: 'sites-panel', className: 'panel' },
      '<h2 id="live-title">Sites live</h2><canvas id="icicle"></canvas><table id="live-sites" class="sites"></table>' +
      '<h2 id="window-title">Sites allocated in the window</h2><table id="window-sites" class="sites"></table>'),
    el('section', { id: 'fragmentation-panel', className: 'panel' }, '<h2>Fragmentation over time</h2><div id="fragmentation"></div>'),
    el('div', { id: 'tooltip' }));
  const tooltip = $('tooltip');
  function showTip(ev, html) { tooltip.innerHTML = html; tooltip.style.display = 'block'; tooltip.style.left = (ev.pageX + 14) + 'px'; tooltip.style.top = (ev.pageY + 14) + 'px'; }
  function hideTip() { tooltip.style.display = 'none'; }

  // ---- summary -----------------------------------------------------------
  {
    const g = summary.gap || {};
    const chain = [['allocated', g.allocated], ['+ pending frees', g.pending_free], ['+ cached free', g.cached_free], ['= reserved', g.reserved],
                   ['+ this process outside the allocator', g.process_outside_allocator], ['= this process (NVML)', g.process_used],
                   ['+ other processes', g.other_processes_used], ['= device used', g.device_used], ['device total', g.device_total]];
    let html = '<h2>Summary <span class="sub">(as <code>cachealloc-analyze summary</code>, after event #' + esc(summary.at_event) + ')</span></h2><div class="cols"><table class="figures"><tr><th colspan="2">From allocated to the device</th></tr>';
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
    const notes = (summary.notes || []).concat(summary.lower_bounds && summary.lower_bounds.length ? ['lower bounds: ' + summary.lower_bounds.join(', ')] : []);
    if (notes.length) html += '<ul class="notes">' + notes.map((n) => '<li>' + esc(n) + '</li>').join('') + '</ul>';
    $('summary').innerHTML = html;
  }
  const peakOf = (metric) => (summary.peaks || []).find((p) => p.metric === metric);

  // ---- state shared by the views ----------------------------------------
  const report = window.cacheallocReport = { ready: false, view: [0, Math.max(0, N - 1)], moment: null, segmentMap: null, liveSites: null, windowSites: null, timelinePeak: null };
  let xmode = 'event';
  let current = null;  // the series drawn now

  // ---- timeline (uPlot) ----------------------------------------------------
  const COLORS = { allocated: '#1f77b4', reserved: '#d62728', active: '#2ca02c' };
  const timelineDiv = $('timeline');
  const width = () => Math.max(600, timelineDiv.clientWidth || document.body.clientWidth - 40);
  const byteAxis = (u, splits) => splits.map((v) => fmtBytes(v));
  const byteIncrs = Array.from({ length: 52 }, (_, i) => 2 ** i);  // ticks at 16 MiB, 32 MiB..., not 19.07 MiB
  const xValues = (u, splits) => splits.map((v) => xmode === 'time' ? (v).toFixed(3) + ' s' : Math.round(v).toLocaleString('en'));
  const bandColors = ['rgba(255,200,0,0.10)', 'rgba(0,160,255,0.08)', 'rgba(160,0,255,0.07)', 'rgba(0,200,100,0.07)'];
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
  function drawOverlays(u) {
    const ctx = u.ctx, top = u.bbox.top, h = u.bbox.height, left = u.bbox.left, w = u.bbox.width;
    ctx.save();
    ctx.beginPath(); ctx.rect(left, top, w, h); ctx.clip();
    const [v0, v1] = report.view;
    ctx.font = (10 * devicePixelRatio) + 'px sans-serif';
    for (const [name, begin, end, depth] of annotations) {
      if (end < v0 || begin > v1) continue;
      const x0 = u.valToPos(xOf(Math.max(begin, v0)), 'x', true), x1 = u.valToPos(xOf(Math.min(end, v1)), 'x', true);
      if (x1 - x0 < 1) continue;
      ctx.fillStyle = bandColors[depth % bandColors.length];
      ctx.fillRect(x0, top, x1 - x0, h);
      if (x1 - x0 > 50 * devicePixelRatio) { ctx.fillStyle = '#666'; ctx.fillText(meta.strings[name] || '', x0 + 3, top + 11 * devicePixelRatio * (depth + 1)); }
    }
    for (const [kind, event, bytes] of markers) {
      if (event < v0 || event > v1) continue;
      const x = u.valToPos(xOf(event), 'x', true);
      ctx.strokeStyle = kind === 'oom' ? '#e00' : '#06c'; ctx.lineWidth = 2 * devicePixelRatio;
      ctx.setLineDash(kind === 'oom' ? [] : [4, 3]);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.stroke();
      ctx.fillStyle = ctx.strokeStyle; ctx.fillText(kind === 'oom' ? 'OOM ' + fmtBytes(bytes) : 'empty_cache', x + 3, top + h - 4);
    }
    ctx.setLineDash([]);
    for (const metric of ['allocated', 'reserved']) {
      const p = peakOf(metric);
      if (!p || p.event === null || p.event < v0 || p.event > v1) continue;
      const x = u.valToPos(xOf(p.event), 'x', true), y = u.valToPos(p.bytes, 'y', true);
      ctx.fillStyle = COLORS[metric];
      ctx.beginPath(); ctx.arc(x, y, 4 * devicePixelRatio, 0, 2 * Math.PI); ctx.fill();
      ctx.fillText('peak ' + metric + ' ' + fmtBytes(p.bytes), Math.min(x + 6, left + w - 160 * devicePixelRatio), y + (metric === 'allocated' ? 12 : -6) * devicePixelRatio);
    }
    if (report.moment !== null && report.moment >= v0 && report.moment <= v1) {
      const x = u.valToPos(xOf(report.moment), 'x', true);
      ctx.strokeStyle = '#000'; ctx.lineWidth = 1; ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.stroke();
    }
    ctx.restore();
  }
  const stepped = uPlot.paths.stepped({ align: 1 });
  const timeline = new uPlot({
    width: width(), height: 340,
    scales: { x: { time: false }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.08 : 1] } },
    axes: [{ label: 'event index', values: xValues }, { label: 'bytes', values: byteAxis, incrs: byteIncrs, size: 80 }],
    series: [
      { label: 'x', value: (u, v) => v === null ? '' : (xmode === 'time' ? v.toFixed(6) + ' s' : '#' + Math.round(v)) },
      { label: 'allocated', stroke: COLORS.allocated, width: 1.5, paths: stepped, value: (u, v) => fmtBytes(v) },
      { label: 'allocated (bucket min)', stroke: 'rgba(31,119,180,0.3)', width: 1, paths: stepped, value: (u, v) => fmtBytes(v) },
      { label: 'reserved', stroke: COLORS.reserved, width: 1.5, paths: stepped, value: (u, v) => fmtBytes(v) },
      { label: 'active', stroke: COLORS.active, width: 1, dash: [5, 3], paths: stepped, value: (u, v) => fmtBytes(v) },
    ],
    bands: [{ series: [1, 2], fill: 'rgba(31,119,180,0.15)' }],
    cursor: { drag: { x: true, y: false, setScale: false } },
    legend: { show: true },
    hooks: {
      draw: [drawOverlays],
      setSelect: [(u) => {
        if (u.select.width < 3) return;
        const a = eventAt(u, u.select.left).event, b = eventAt(u, u.select.left + u.select.width).event;
        const bEnd = current.exact ? b : Math.min(N - 1, b + current.width - 1);
        u.setSelect({ left: 0, width: 0 }, false);
        setView(a, Math.max(a, bEnd));
      }],
    },
  }, [[], [], [], [], []], timelineDiv);

  function setView(a, b) {
    a = Math.max(0, Math.min(N - 1, Math.round(a))); b = Math.max(a, Math.min(N - 1, Math.round(b)));
    report.view = [a, b];
    // No events: the one state there is, the layout the file holds.
    current = N === 0 ? { exact: true, ev: [0], t: [0], amax: [meta.start[0]], amin: [meta.start[0]], rmax: [meta.start[1]], cmax: [meta.start[2]] } : seriesFor(a, b);
    const xs = xmode === 'time' ? Array.from(current.t, (t) => t / 1e9) : Array.from(current.ev);
    timeline.axes[0].label = xmode === 'time' ? 'time since the first event (s)' : 'event index';
    timeline.setData([xs, current.amax, current.amin, current.rmax, current.cmax]);
    let peak = 0;
    for (let j = 0; j < current.amax.length; ++j) peak = Math.max(peak, current.amax[j]);
    let peakReserved = 0;
    for (let j = 0; j < current.rmax.length; ++j) peakReserved = Math.max(peakReserved, current.rmax[j]);
    const whole = a === 0 && b >= N - 1;
    report.timelinePeak = whole ? Math.max(peak, meta.start[0]) : peak;
    report.timelinePeakReserved = whole ? Math.max(peakReserved, meta.start[1]) : peakReserved;
    $('window-label').textContent = 'window: events #' + a.toLocaleString('en') + ' to #' + b.toLocaleString('en') +
      (current.exact ? ' (every event)' : ' (min and max per ' + current.width + ' events)');
    $('timeline-legend').innerHTML = '<span><i style="background:' + COLORS.allocated + '"></i>allocated</span><span><i style="background:' + COLORS.reserved + '"></i>reserved</span>' +
      '<span><i style="background:' + COLORS.active + '"></i>active (allocated + pending frees)</span><span><i style="background:rgba(255,200,0,0.3)"></i>annotation phase</span>' +
      '<span><i style="background:#e00"></i>OOM</span><span><i style="background:#06c"></i>empty_cache</span><span><i class="dot"></i>peak (as <code>summary</code>)</span>';
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
    selectMoment(peakIn(from, to));
  });
  timeline.over.addEventListener('dblclick', () => setView(0, N - 1));
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
  $('reset').onclick = () => setView(0, N - 1);
  for (const radio of document.querySelectorAll('input[name=xmode]')) radio.onchange = () => { xmode = radio.value; setView(...report.view); };

  // ---- segment map ---------------------------------------------------------
  const SEG_COLORS = { allocated: '#1f77b4', waste: '#ff9f1c', pending: '#9467bd', cached: '#b7dfb0', split: '#f4a6a6', unmapped: '#e6e6e6' };
  const SEG_LABELS = { allocated: 'allocated (requested bytes)', waste: 'rounding waste inside allocated blocks', pending: 'pending free (waits for other streams)',
                       cached: 'cached free', split: 'inactive split (free, in a segment still holding a block)', unmapped: 'unmapped expandable pages' };
  $('segment-legend').innerHTML = Object.keys(SEG_COLORS).map((k) => '<span><i style="background:' + SEG_COLORS[k] + '"></i>' + SEG_LABELS[k] + '</span>').join('');
  const canvas = $('segment-map');
  const ROW = 18, LABEL = 210;
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
                      site: b.state <= ST.pending ? siteName(siteOfStack(b.stack)) : null, stack: b.stack, cls: blockClass(b, seg, hasActive) });
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
    ctx.font = '11px monospace';
    const barW = w - LABEL - 4;
    model.forEach((seg, row) => {
      const y = row * ROW + 2;
      ctx.fillStyle = '#333';
      ctx.fillText(hex(seg.address) + ' ' + fmtBytes(seg.size) + ' ' + seg.pool, 2, y + 12);
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
    const m = report.segmentMap; if (!m) return;
    const rect = canvas.getBoundingClientRect(), x = ev.clientX - rect.left, row = Math.floor((ev.clientY - rect.top - 2) / ROW);
    const seg = m.segments[row]; if (!seg) return hideTip();
    let hit = null;
    for (const b of seg.blocks) if (x >= b.x0 - 0.5 && x <= b.x1 + 0.5) { hit = b; if (x <= b.x1) break; }
    if (!hit) return showTip(ev, '<b>segment ' + hex(seg.address) + '</b><br>' + fmtBytes(seg.size) + ', ' + seg.blocks.length + ' blocks');
    let html = '<b>' + esc(SEG_LABELS[hit.cls]) + '</b><br>block ' + hex(hit.address) + ' (offset ' + fmtBytes(hit.address - seg.address) + ')<br>size ' + fmtBytes(hit.size);
    if (hit.requested !== null) html += ', requested ' + fmtBytes(hit.requested) + ', rounding ' + fmtBytes(hit.size - hit.requested);
    if (hit.site) html += '<br><br>' + siteLines(siteOfStack(hit.stack)).map(esc).join('<br>');
    html += '<br><br><i>segment ' + hex(seg.address) + ', ' + fmtBytes(seg.size) + ', ' + seg.pool + (seg.expandable ? '' : ' pool') + '</i>';
    showTip(ev, html);
  });
  canvas.addEventListener('mouseleave', hideTip);

  // ---- sites live at the moment, and an icicle of their stacks ------------
  function liveSites(layout, event) {
    const bySite = new Map();
    for (const seg of layout.segs) for (let b = seg.first; b; b = b.next) {
      if (b.state !== ST.allocated) continue;
      const site = siteOfStack(b.stack), s = bySite.get(site) || { site, bytes: 0, blocks: 0 };
      s.bytes += b.size; s.blocks += 1; bySite.set(site, s);
    }
    const rows = [...bySite.values()].sort((x, y) => y.bytes - x.bytes || x.site - y.site);
    report.liveSites = rows.map((r) => ({ site: siteName(r.site), stack: siteLines(r.site), bytes: r.bytes, blocks: r.blocks }));
    const total = rows.reduce((n, r) => n + r.bytes, 0);
    $('live-title').textContent = 'Sites live ' + (event < 0 ? 'before the first event' : 'after event #' + event.toLocaleString('en')) + ': ' + fmtBytes(total) + ' allocated in ' + rows.length + ' sites';
    $('live-sites').innerHTML = '<tr><th>#</th><th>live</th><th>blocks</th><th>share</th><th>site</th></tr>' + rows.slice(0, 20).map((r, i) =>
      '<tr><td class="num">' + (i + 1) + '</td><td class="num">' + fmtBytes(r.bytes) + '</td><td class="num">' + r.blocks + '</td><td class="num">' + (total ? (100 * r.bytes / total).toFixed(1) : '0') + '%</td><td title="' + esc(siteLines(r.site).join('\n')) + '">' + esc(siteName(r.site)) + '</td></tr>').join('');
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
    report.windowSites = { from: a, to: b, sites: rows.map((r) => ({ site: siteName(r.site), stack: siteLines(r.site), allocations: r.allocations, bytes: r.bytes })) };
    $('window-title').textContent = 'Sites allocated in events #' + a.toLocaleString('en') + ' to #' + b.toLocaleString('en') + ' (as top --from ' + a + ' --to ' + b + ')';
    $('window-sites').innerHTML = '<tr><th>#</th><th>allocations</th><th>allocated</th><th>site</th></tr>' + rows.slice(0, 20).map((r, i) =>
      '<tr><td class="num">' + (i + 1) + '</td><td class="num">' + r.allocations.toLocaleString('en') + '</td><td class="num">' + fmtBytes(r.bytes) + '</td><td title="' + esc(siteLines(r.site).join('\n')) + '">' + esc(siteName(r.site)) + '</td></tr>').join('') +
      (rows.length > 20 ? '<tr><td colspan="4">' + (rows.length - 20) + ' more sites</td></tr>' : '');
  }

  function selectMoment(event) {
    report.moment = event;
    const layout = layoutAfter(event);
    drawSegmentMap(layout, event);
    liveSites(layout, event);
    timeline.redraw(false);
  }

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

  window.addEventListener('resize', () => { timeline.setSize({ width: width(), height: 340 }); fragmentationChart.setSize({ width: width(), height: 240 }); });

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
  report.setView = setView;
  report.peakEvent = peakOf('allocated') ? peakOf('allocated').event : null;
  report.keyframes = keyframes.length;
  report.keyframeEvents = keyframes.map((k) => k.before);  // the event each keyframe's state precedes

  setView(0, Math.max(0, N - 1));
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
