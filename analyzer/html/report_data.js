// The cachealloc HTML report's page script (inlined by cachealloc-analyze html),
// part: payloads, formatting, keyframes and the event cursor.
// Data comes from the analyzer (analyzer/src/render/html_report.cpp, which documents
// the columns); the page only decodes, replays from the nearest keyframe, and
// draws. uPlot draws the two charts; the segment map and the icicle are ours.
// The parts (report_*.js, in the order assets.cmake lists them) share one
// function scope: this part opens it, report_main.js closes it.
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
  const [meta, summary, oom, fragmentation, markers] = await Promise.all(
    ['data-meta', 'data-summary', 'data-oom', 'data-fragmentation', 'data-markers'].map(jsonOf));
  // Phase bands [name, begin, end, depth]: names and begins delta-coded.
  const annotations = [];
  {
    const bandBytes = await bytesOf('data-annotations'), r = new Reader(bandBytes);
    let name = 0, begin = 0;
    while (r.p < bandBytes.length) { name += r.s(); begin += r.s(); const length = r.u(); annotations.push([name, begin, begin + length, r.u()]); }
  }
  // An alloc's kind byte holds its category in the high bits.
  const [kinds, addresses, sizes, auxes, stacks, streams, times, bucketBytes, bucketCategoryBytes, keyframeBytes] = await Promise.all(
    ['data-kinds', 'data-addresses', 'data-sizes', 'data-auxes', 'data-stacks', 'data-streams', 'data-times',
     'data-buckets', 'data-bucket-categories', 'data-keyframes'].map(bytesOf));
  const CATS = meta.categories.map(([key, label, inferred]) => ({ key, label, inferred }));
  const N = meta.events;
  // A trace begun mid-run that opens with annotations older than its first
  // memory event: that event, where the views start, and before which no
  // memory was recorded (0 otherwise). The state before the first event
  // (-1) is the ring's start, just before this event: that one is known.
  const RING_BEGINS = meta.ring_begins_at || 0;
  // ---- detail windows ----------------------------------------------------
  // The events kept event by event (all of them within the detail budget),
  // each window's kinds consecutive in the kinds column.
  const details = [];
  for (const [from, to, why] of meta.detail_windows) {
    const prev = details[details.length - 1];
    details.push({ from, to, why, kindsAt: prev ? prev.kindsAt + prev.to - prev.from + 1 : 0 });
  }
  const wholeDetail = details.length === 1 && details[0].from === 0 && details[0].to === N - 1;
  // The detail window holding events [from, to], or null.
  const detailOf = (from, to) => details.find((w) => w.from <= from && to <= w.to) || null;
  const kindOf = (event) => { const w = detailOf(event, event); return w ? kinds[w.kindsAt + event - w.from] & 15 : K.other; };
  // The state after `event` is in the page when its window holds the event,
  // and the next one where that settles a free (free_requested, then its
  // free_completed), or the trace ends there.
  const momentKept = (event) => N === 0 || (event >= 0 && event < RING_BEGINS ? false : event < 0 ? details.length > 0 && details[0].from === 0 :
    details.some((w) => w.from <= event && (event < w.to || (event === w.to && (w.to === N - 1 || kindOf(event) !== K.free_requested)))));
  const evRange = (w) => 'events #' + w.from.toLocaleString('en') + ' to #' + w.to.toLocaleString('en');
  const detailList = () => details.map((w) => evRange(w) + ' (' + w.why.join(', ') + ')').join('; ');
  // The detail window nearest to `event`, and the event in it nearest to it.
  function nearestDetail(event) {
    let best = null, bestEvent = 0, bestGap = Infinity;
    for (const w of details) {
      const e = Math.max(w.from, Math.min(w.to === N - 1 ? w.to : w.to - 1, event)), gap = Math.abs(e - event);
      if (gap < bestGap) { best = w; bestEvent = e; bestGap = gap; }
    }
    return best && { window: best, event: bestEvent };
  }
  mark('decoded');

  // ---- formatting --------------------------------------------------------
  function fmtBytes(b) {
    if (b === null || b === undefined) return 'unknown';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let v = Math.abs(b), u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; ++u; }
    return (b < 0 ? '-' : '') + (u === 0 ? String(v) : v.toFixed(2)) + ' ' + units[u];
  }
  // Axis ticks: "512 MiB", not "512.00 MiB" (the ticks are powers of two).
  function fmtTick(b) { return fmtBytes(b).replace(/\.00 /, ' '); }
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
      this.address = frame.addressBase; this.time = frame.timeBase; this.kp = frame.off[6];
      this.e = { kind: 0, address: 0, size: 0, aux: 0, stack: 0, stream: 0, time: 0, category: 0 };
    }
    next() {
      const e = this.e, byte = kinds[this.kp++], kind = byte & 15;
      ++this.i;
      e.kind = kind; e.category = byte >> 4;
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

