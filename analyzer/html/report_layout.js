// The cachealloc HTML report's page script, part: the layout replay from the nearest keyframe.
// The parts (report_*.js, in the order assets.cmake lists them) share one
// function scope: report_data.js opens it, report_main.js closes it.
  // ---- the layout replay (analyzer/src/core/replay.cpp's rules, blocks only) ----
  class Layout {
    constructor(frame) {
      this.blocks = new Map(); this.segs = [];
      this.allocated = 0; this.active = 0; this.reserved = 0;
      this.byCategory = new Float64Array(CATS.length);  // allocated bytes per category
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
          const blk = { address: at, size: r.u(), state: r.u(), requested: 0, stack: 0, category: 0, seg, prev, next: null };
          if (blk.state <= ST.pending) { blk.requested = blk.size - r.s(); blk.stack = r.u(); blk.category = r.u(); }
          if (prev) prev.next = blk; else seg.first = blk;
          prev = blk; at += blk.size;
          this.blocks.set(blk.address, blk);
          if (blk.state !== ST.unmapped) seg.mapped += blk.size;
          if (blk.state === ST.allocated) { this.allocated += blk.size; this.byCategory[blk.category] += blk.size; }
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
      const tail = { address: at, size: blk.address + blk.size - at, state: blk.state, requested: 0, stack: 0, category: 0, seg: blk.seg, prev: blk, next: blk.next };
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
          b.state = ST.allocated; b.requested = e.aux; b.stack = e.stack; b.category = e.category;
          this.allocated += size; this.active += size; this.byCategory[e.category] += size;
          return;
        }
        case K.free_requested: {
          const b = this.blocks.get(e.address);
          if (!b || b.state !== ST.allocated) return;
          b.state = ST.pending; this.allocated -= b.size; this.byCategory[b.category] -= b.size;
          return;
        }
        case K.free_completed: {
          const b = this.blocks.get(e.address);
          if (!b || b.state > ST.pending) return;
          if (b.state === ST.allocated) { this.allocated -= b.size; this.byCategory[b.category] -= b.size; }
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
            const b = { address: e.address, size: e.size, state: ST.inactive, requested: 0, stack: 0, category: 0, seg, prev: last, next: null };
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
      const b = { address, size, state: ST.inactive, requested: 0, stack: 0, category: 0, seg, prev: null, next: null };
      seg.first = b; this.blocks.set(address, b);
      this.segs.push(seg);
      this.reserved += size;
    }
    segmentRelease(address) {
      const at = this.segs.findIndex((s) => s.address === address);
      if (at < 0) return;
      const seg = this.segs[at];
      for (let b = seg.first; b; b = b.next) {
        if (b.state === ST.allocated) { this.allocated -= b.size; this.byCategory[b.category] -= b.size; }
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
  // Null where the page does not hold that state (outside the detail windows).
  function layoutAfter(event) {
    if (!momentKept(event)) return null;
    const end = N === 0 || event < 0 ? N : detailOf(event, event).to + 1;  // the window's end
    // A keyframe before `event` itself (not only before event + 1): the
    // settling needs the event's own address.
    const frame = keyframeFor(kindOf(event) === K.free_requested ? event : event + 1);
    const layout = new Layout(frame), cursor = new Cursor(frame);
    let lastKind = -1, lastAddress = 0;
    while (cursor.i <= event && cursor.i < N) {
      const e = cursor.next();  // the cursor's one event object, refilled by each next()
      layout.apply(e);
      lastKind = e.kind; lastAddress = e.address;
    }
    if (lastKind === K.free_requested && cursor.i < end) {
      const next = cursor.next();
      if (next.kind === K.free_completed && next.address === lastAddress) layout.apply(next);
    }
    return layout;
  }
  // Per-event totals, allocated per category and times over [from, to]
  // (inclusive, inside one detail window), exact.
  function exactSeries(from, to) {
    const frame = keyframeFor(from);
    const layout = new Layout(frame), cursor = new Cursor(frame);
    const n = to - from + 1;
    const out = { ev: new Float64Array(n), t: new Float64Array(n), a: new Float64Array(n), r: new Float64Array(n), c: new Float64Array(n),
                  cats: CATS.map(() => new Float64Array(n)) };
    while (cursor.i <= to) {
      const i = cursor.i, e = cursor.next();
      layout.apply(e);
      if (i >= from) { const j = i - from; out.ev[j] = i; out.t[j] = e.time; out.a[j] = layout.allocated; out.r[j] = layout.reserved; out.c[j] = layout.active;
                      for (let k = 0; k < CATS.length; ++k) out.cats[k][j] = layout.byCategory[k]; }
    }
    return out;
  }

