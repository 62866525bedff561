// The pictures, checked in Debian's headless Chromium (CTest: test_browser_report).
//
// For every snapshot and PyTorch pickle under testdata/:
//   - cachealloc-analyze html writes a report; opened from file://, it renders
//     with no console error, no page error and no request beyond the file;
//   - the timeline is drawn and its peak equals `summary --format json`;
//   - a click at the peak's pixel selects that event, and the segment map then
//     holds exactly the segments and blocks `segments --at PEAK --format json` lists;
//   - so do the segment map and the sites live (against the active blocks of
//     `segments --at`, summed by site) at 20 events spread over the whole trace and
//     on both sides of up to 6 keyframes (the page rebuilds each from its nearest
//     keyframe; the long runs of testdata/pytorch/long have many keyframes, and at
//     least three inputs of three or more keyframes must pass at every moment);
//   - a brush (drag) over the timeline selects a window whose sites panel holds
//     the sites `top --from A --to B --format json` gives, with their counts and bytes;
//   - the first screen (1600x1200) answers "what is the memory made of": the peak
//     panel starts within it and holds what `peak --format json` lists (bytes by
//     category and by site); the category bands add up to allocated at points
//     spread over the run and over a window drawn event by event; the hovered
//     band's sites add up to its bytes; no label leaves its box; the y axis is as
//     wide as its ticks; OOM has its own colour; OOMs and empty_cache calls are
//     counted ticks, not lines; the legend off the chart shows the peak, never
//     "unknown"; segments are drawn to scale; no two site labels of a table match.
// And for a few of them: the flamegraph SVG parses as XML and renders with no
// error; export --what perfetto passes perfetto.schema.json (ajv) and its
// counters reach the summary's peaks.
//
// usage: node report_test.cjs ANALYZE TESTDATA OUTDIR NODE_MODULES [CHROMIUM]
'use strict';
const { execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const [analyze, testdata, outdir, modules, chromium = '/usr/bin/chromium'] = process.argv.slice(2);
const puppeteer = require(path.resolve(modules, 'puppeteer-core'));
const Ajv = require(path.resolve(modules, 'ajv'));

function run(args) { return execFileSync(analyze, args, { maxBuffer: 1 << 30 }).toString(); }
function json(args) { return JSON.parse(run(args.concat(['--format', 'json']))); }
function inputs(dir) {
  const found = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) found.push(...inputs(p));
    else if (/\.(bin|pickle)(\.(zst|gz))?$/.test(entry.name)) found.push(p);
  }
  return found.sort();
}

let failures = 0;
function check(ok, what) {
  if (!ok) { ++failures; console.log('  FAIL ' + what); }
  return ok;
}

// A page that records every console error, page error and request.
// Known disagreements, each failing the test once it is fixed (so the entry
// goes): for this pickle, the layout before the first event that
// derive_initial_layout() infers (which `segments --at`, replay_to() and so the
// page and the Perfetto export start from) holds 20 MiB more reserved memory
// than the empty start that analyze() confirms and PyTorch's own
// reserved_bytes.all.peak (2394947584, its .stats.json) agrees with.
const KNOWN = {};
function known(name, what, ok, message) {
  if ((KNOWN[name] || []).includes(what)) {
    if (ok) check(false, message + ': passes now; remove it from KNOWN');
    else console.log('  known ' + message);
    return;
  }
  check(ok, message);
}

async function open(browser, file) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1600, height: 1200 });
  const problems = [];
  const url = 'file://' + path.resolve(file);
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warn') problems.push('console ' + m.type() + ': ' + m.text()); });
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('request', (r) => { if (r.url() !== url) problems.push('request: ' + r.url()); });
  page.on('requestfailed', (r) => problems.push('request failed: ' + r.url()));
  const started = Date.now();
  await page.goto(url, { waitUntil: 'load', timeout: 60000 });
  return { page, problems, started, url };
}

// The page's segment map against `segments --at E --format json`: every
// segment and block, in order. Reports the first difference; true when equal.
function sameMap(map, expected, name) {
  const got = map.segments;
  let same = check(got.length === expected.segments.length, name + ': ' + got.length + ' segments drawn, segments --at lists ' + expected.segments.length);
  for (let i = 0; same && i < got.length; ++i) {
    const g = got[i], e = expected.segments[i];
    same = check(g.address === parseInt(e.address, 16) && g.size === e.size && g.reserved === e.reserved &&
                 g.allocated === e.allocated && g.blocks.length === e.blocks && g.pool === e.pool,
                 name + ': segment ' + e.address + ' as segments --at shows it (' + JSON.stringify({ address: g.address, size: g.size, reserved: g.reserved, allocated: g.allocated, blocks: g.blocks.length }) + ')');
  }
  const blocks = got.flatMap((g) => g.blocks);
  same = same && check(blocks.length === expected.blocks.length, name + ': ' + blocks.length + ' blocks drawn, segments --at lists ' + expected.blocks.length);
  for (let i = 0; same && i < blocks.length; ++i) {
    const g = blocks[i], e = expected.blocks[i];
    same = check(g.address === parseInt(e.address, 16) && g.size === e.size && g.state === e.state &&
                 g.requested === e.requested && g.site === e.site,
                 name + ': block ' + e.address + ' (' + JSON.stringify(g) + ' vs ' + JSON.stringify(e) + ')');
  }
  return same;
}

// Sites live at a moment, as the page lists them (one row per stack), against
// the active blocks of `segments --at`, both summed by the site's name (stacks
// that differ further out share their first frame of the program).
function sameLiveSites(sites, expected, name) {
  const sum = (rows) => {
    const bySite = new Map();
    for (const r of rows) { const s = bySite.get(r.site) || { bytes: 0, blocks: 0 }; s.bytes += r.bytes; s.blocks += r.blocks; bySite.set(r.site, s); }
    return bySite;
  };
  const got = sum(sites);
  const want = sum(expected.blocks.filter((b) => b.state === 'active_allocated').map((b) => ({ site: b.site, bytes: b.size, blocks: 1 })));
  let same = check(got.size === want.size, name + ': ' + got.size + ' live sites on the page, segments --at holds ' + want.size);
  for (const [site, g] of same ? got : []) {
    const e = want.get(site);
    same = check(e !== undefined && g.bytes === e.bytes && g.blocks === e.blocks,
                 name + ': live site ' + JSON.stringify(Object.assign({ site }, g)) + ' vs ' + JSON.stringify(e));
    if (!same) break;
  }
  return same;
}

// 20 events spread over [0, last], and both sides of up to 6 keyframes spread
// over the trace (the last event a keyframe's predecessor rebuilds, and the first
// the keyframe itself starts).
function momentsToCheck(last, keyframeEvents) {
  const points = new Set(Array.from({ length: 20 }, (_, j) => Math.round((j * last) / 19)));
  const inner = keyframeEvents.filter((e) => e > 0 && e <= last);
  const picked = inner.length <= 6 ? inner : Array.from({ length: 6 }, (_, j) => inner[Math.round((j * (inner.length - 1)) / 5)]);
  for (const e of picked) { points.add(e - 1); points.add(e); }
  return [...points].sort((a, b) => a - b);
}

// CACHEALLOC_BROWSER_ONE_INPUT=1: TESTDATA is a folder of one large trace (docs/VERIFICATION.md).
const oneInput = process.env.CACHEALLOC_BROWSER_ONE_INPUT === '1';
let mostKeyframes = 0;
let manyKeyframeInputs = 0;   // inputs of 3 or more keyframes whose every moment was checked
let momentsChecked = 0;

async function checkReport(browser, input, name) {
  const html = path.join(outdir, name + '.html');
  run(['html', input, '-o', html, '-f']);
  const summary = json(['summary', input]);
  const { page, problems, started } = await open(browser, html);
  const ready = await page.waitForFunction(() => window.cacheallocReport && window.cacheallocReport.ready, { timeout: 60000 })
    .then(() => true, () => false);
  const interactive = Date.now() - started;
  check(ready, name + ': the report became interactive');
  if (!ready) { console.log('  ' + problems.join('\n  ')); await page.close(); return; }
  const state = () => page.evaluate(() => JSON.parse(JSON.stringify({
    peak: window.cacheallocReport.timelinePeak, peakReserved: window.cacheallocReport.timelinePeakReserved, map: window.cacheallocReport.segmentMap,
    window: window.cacheallocReport.windowSites, moment: window.cacheallocReport.moment,
    points: document.querySelectorAll('#timeline canvas').length })));
  let s = await state();
  check(s.points > 0, name + ': the timeline is drawn');
  check(s.peak === summary.peak_allocated, name + ': timeline peak ' + s.peak + ' == summary peak_allocated ' + summary.peak_allocated);
  known(name, 'reserved', s.peakReserved === summary.peak_reserved,
        name + ': timeline reserved peak ' + s.peakReserved + ' == summary peak_reserved ' + summary.peak_reserved);

  if (summary.ring_begins_at !== undefined) await checkBeforeRing(page, input, name, summary);
  await checkFirstScreen(page, input, name, summary);

  // Click at the peak's pixel.
  const peakEvent = summary.peak_allocated_event;
  if (peakEvent !== null && peakEvent !== undefined) {
    const at = await page.evaluate((e) => window.cacheallocReport.pixelOf(e), peakEvent);
    await page.evaluate(() => { window.cacheallocReport.moment = null; });
    await page.mouse.click(at.x, at.y);
    s = await state();
    check(s.moment === peakEvent, name + ': a click at the peak selects event #' + peakEvent + ' (got ' + s.moment + ')');
    sameMap(s.map, json(['segments', input, '--at', String(peakEvent)]), name);
  }

  // The segment map and the live sites at 20 events spread over the trace, and
  // on both sides of a few keyframes, each rebuilt by the page from its nearest
  // keyframe, against `segments --at`.
  const lastEvent = summary.at_event;
  const keyframes = await page.evaluate(() => window.cacheallocReport.keyframes);
  const keyframeEvents = await page.evaluate(() => window.cacheallocReport.keyframeEvents);
  mostKeyframes = Math.max(mostKeyframes, keyframes);
  let mapsChecked = 0;
  if (lastEvent !== null && lastEvent !== undefined) {
    // Past the detail budget, the moments inside the detail windows (checkDetailBudget checks the others).
    const spread = momentsToCheck(lastEvent, keyframeEvents);
    const kept = await page.evaluate((points) => points.map((e) => window.cacheallocReport.momentKept(e)), spread);
    const points = spread.filter((e, j) => kept[j]);
    for (const at of points) {
      const page_ = await page.evaluate((e) => { const r = window.cacheallocReport; r.selectMoment(e);
        return JSON.parse(JSON.stringify({ map: r.segmentMap, sites: r.liveSites })); }, at);
      const expected = json(['segments', input, '--at', String(at)]);
      if (!sameMap(page_.map, expected, name + ' at #' + at)) break;
      if (!sameLiveSites(page_.sites, expected, name + ' at #' + at)) break;
      ++mapsChecked;
    }
    check(mapsChecked === points.length, name + ': the page equals segments --at at all ' + points.length + ' events chosen');
    if (keyframes >= 3 && mapsChecked === points.length) ++manyKeyframeInputs;
    momentsChecked += mapsChecked;
  }

  // Brush over 30%..60% of the plot.
  const box = await page.evaluate(() => window.cacheallocReport.plotBox());
  if (summary.events && Object.values(summary.events).reduce((a, b) => a + b, 0) > 20) {
    const y = box.y + box.height / 2;
    await page.mouse.move(box.x + box.width * 0.3, y);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * 0.45, y, { steps: 5 });
    await page.mouse.move(box.x + box.width * 0.6, y, { steps: 5 });
    await page.mouse.up();
    s = await state();
    const w = s.window;
    check(w.from > 0 || w.to < summary.at_event, name + ': the brush selected a window (#' + w.from + ' to #' + w.to + ')');
    const top = w.sites === null ? { sites: [] } : json(['top', input, '--from', String(w.from), '--to', String(w.to), '--limit', '0']);
    const expected = top.sites.filter((site) => site.allocations > 0);
    if (w.sites === null) w.sites = [];  // outside the detail windows: the page says so (checkDetailBudget)
    let same = check(w.sites.length === expected.length, name + ': ' + w.sites.length + ' sites in the window, top lists ' + expected.length);
    for (let i = 0; same && i < expected.length; ++i) {
      const g = w.sites[i], e = expected[i];
      same = check(JSON.stringify(g.stack) === JSON.stringify(e.stack) && g.allocations === e.allocations && g.bytes === e.allocated_over_run,
                   name + ': site #' + (i + 1) + ' ' + JSON.stringify(g) + ' vs ' + JSON.stringify(e));
    }
  }
  // A window of fewer than 10,000 events is drawn event by event.
  // (past the detail budget: the first 1,000 events of the first detail window)
  const exact = await page.evaluate(() => { const r = window.cacheallocReport, w = r.detailWindows[0] || { from: 0, to: 999 };
    r.setView(w.from, Math.min(w.to, w.from + 999)); return { points: r.drawnPoints(), view: r.view }; });
  check(exact.points === exact.view[1] - exact.view[0] + 1, name + ': events #0 to #' + exact.view[1] + ' drawn as ' + exact.points + ' points, one per event');
  await page.evaluate((w) => window.cacheallocReport.setView(w.from, w.to), s.window);
  // The time axis: the same window, drawn against time.
  await page.click('input[name=xmode][value=time]');
  const timeAxis = await page.evaluate(() => ({ label: window.cacheallocReport.axisLabel() === 'time since the first event (s)',
    points: window.cacheallocReport.drawnPoints(),
    view: window.cacheallocReport.view }));
  check(timeAxis.label && timeAxis.points > 0, name + ': the timeline is drawn against time, its axis labelled');
  check(JSON.stringify(timeAxis.view) === JSON.stringify([s.window.from, s.window.to]) || !s.window, name + ': switching the axis keeps the window');
  check(problems.length === 0, name + ': no console errors and no requests' + (problems.length ? ':\n    ' + problems.join('\n    ') : ''));
  console.log('ok   ' + name + ' (' + fs.statSync(html).size + ' bytes, ' + keyframes + ' keyframes, segment map and live sites held to segments --at at ' +
              mapsChecked + ' events, interactive after ' + interactive + ' ms)');
  await page.close();
}

// A trace begun mid-run that opens with annotations older than its first
// memory event R: the page opens on [R, last], draws no memory before R when
// zoomed out, and shows no layout there; the CLI refuses a moment before R.
async function checkBeforeRing(page, input, name, summary) {
  const R = summary.ring_begins_at, last = summary.at_event;
  const got = await page.evaluate((last) => { const r = window.cacheallocReport, opened = r.view.slice(), moment = r.moment;
    r.setView(0, last); const drawn = r.drawnAllocated(); r.selectMoment(r.ringBegins - 1);
    const map = JSON.parse(JSON.stringify(r.segmentMap)), note = document.getElementById('segments-note').textContent;
    r.setView(...opened); r.selectMoment(moment);
    return { opened, ring: r.ringBegins, drawn, map, note }; }, last);
  check(got.ring === R && got.opened[0] === R && got.opened[1] === last,
        name + ': the page opens on events #' + R + ' to #' + last + ', from the ring\'s first memory event (got ' + JSON.stringify(got.opened) + ')');
  const wrong = got.drawn.filter(([e, v]) => (e < R) !== (v === null));
  check(got.drawn.some(([e]) => e < R) && wrong.length === 0,
        name + ': zoomed out, no memory is drawn before #' + R + ' and every point after it is' + (wrong.length ? ' (first wrong: ' + JSON.stringify(wrong[0]) + ')' : ''));
  check(got.map.segments === null && got.map.beforeRing === R && /no memory was recorded/.test(got.note),
        name + ': the segment map at #' + (R - 1) + ' says no memory was recorded there');
  let status = 0, stderr = '';
  try { execFileSync(analyze, ['segments', input, '--at', String(R - 1)], { stdio: 'pipe' }); }
  catch (e) { status = e.status; stderr = e.stderr.toString(); }
  check(status === 2 && stderr.trim().split('\n').length === 1 && stderr.includes('#' + R),
        name + ': segments --at ' + (R - 1) + ' is refused with exit 2 and one line naming #' + R + ' (' + status + ', ' + JSON.stringify(stderr) + ')');
  const rows = json(['timeline', input]).timeline;
  check(rows.length > 0 && rows.every((row) => row.first_event === null || row.first_event >= R),
        name + ': timeline rows start at #' + R);
}

function fmtBytes(b) {  // the page's own formatting
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = Math.abs(b), u = 0;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; ++u; }
  return (b < 0 ? '-' : '') + (u === 0 ? String(v) : v.toFixed(2)) + ' ' + units[u];
}

async function checkFirstScreen(page, input, name, summary) {
  const peak = json(['peak', input]);
  const got = await page.evaluate(() => {
    const r = window.cacheallocReport, rect = (e) => { const b = e.getBoundingClientRect(); return { left: b.left, right: b.right, top: b.top + scrollY, bottom: b.bottom + scrollY }; };
    const inside = (a, b) => a.left >= b.left - 0.5 && a.right <= b.right + 0.5 && a.top >= b.top - 0.5 && a.bottom <= b.bottom + 0.5;
    const labels = [];
    for (const l of document.querySelectorAll('#timeline-labels .chart-label')) labels.push({ text: l.textContent, ok: inside(rect(l), rect(document.getElementById('timeline-labels'))) });
    const strip = document.getElementById('markers');
    for (const l of document.querySelectorAll('#markers .marker-label')) {
      const b = rect(l), s = rect(strip);
      const inBar = l.dataset.x0 === undefined || (b.left - s.left >= Number(l.dataset.x0) - 0.5 && b.right - s.left <= Number(l.dataset.x1) + 0.5);
      labels.push({ text: l.textContent, ok: inside(b, s) && inBar });
    }
    const tables = {};
    for (const id of ['peak-sites', 'live-sites', 'window-sites']) tables[id] = [...document.querySelectorAll('#' + id + ' td.site-label')].map((c) => c.textContent);
    return JSON.parse(JSON.stringify({ panel: document.getElementById('peak-panel') ? rect(document.getElementById('peak-panel')).top : null,
      labels, tables, axis: r.axisFit, colors: r.colors, peak: r.peakPanel, markers: r.markerRows || [], sample: r.seriesSample ? r.seriesSample(60) : null,
      map: r.segmentMap }));
  });
  check(got.panel !== null && got.panel < 1200, name + ': the peak panel starts within the first 1200 px (at ' + got.panel + ')');
  samePeakPanel(got.peak, peak, name);
  for (const l of got.labels) check(l.ok, name + ': the label "' + l.text + '" stays inside its box');
  check(got.axis && got.axis.widest + got.axis.tick + got.axis.gap <= got.axis.size, name + ': the y axis (' + JSON.stringify(got.axis) + ') is wider than its ticks, so its title does not overlap them');
  check(got.colors && got.colors.oom !== got.colors.reserved && !Object.values(got.colors.categories).includes(got.colors.oom),
        name + ': OOM has its own colour (' + JSON.stringify(got.colors) + ')');
  const ooms = (summary.events || {}).oom || 0, emptied = (summary.events || {}).empty_cache || 0;
  const row = (kind) => got.markers.find((m) => m.kind === kind) || { count: 0, ticks: 0 };
  check(row('oom').count === ooms && row('empty_cache').count === emptied, name + ': the marker strip counts ' + row('oom').count + ' OOMs and ' + row('empty_cache').count + ' empty_cache calls, summary ' + ooms + ' and ' + emptied);
  const sumsHold = (sample) => sample && sample.points.length > 0 && sample.points.every((q) => q.categories.reduce((a, b) => a + b, 0) === q.allocated && q.stackTop === q.allocated);
  check(sumsHold(got.sample), name + ': the category bands add up to allocated at ' + (got.sample ? got.sample.points.length : 0) + ' points of the run');
  const exact = await page.evaluate(() => { const r = window.cacheallocReport; if (!r.seriesSample) return { s: { exact: false, points: [] }, band: null }; const w = r.detailWindows[0] || { from: 0, to: 999 }; r.setView(w.from, Math.min(w.to, w.from + 999)); const s = r.seriesSample(60);
    // The largest band at the middle point, as a hover there shows it.
    // (after the ring's first memory event, where a trace begun mid-run has one)
    const recorded = s.points.filter((q) => q.event >= r.ringBegins), p = recorded[Math.floor(recorded.length / 2)];
    let bk = -1;
    if (p) p.categories.forEach((v, k) => { if (v > 0 && (bk < 0 || v > p.categories[bk])) bk = k; });
    return JSON.parse(JSON.stringify({ s, band: bk < 0 ? null : r.hoverBand(p.index, bk) })); });
  check(exact.s.exact && sumsHold(exact.s), name + ': the category bands add up to allocated at every sampled event of events #0 to #999');
  if (exact.band) check(exact.band.sites.reduce((a, x) => a + x.bytes, 0) === exact.band.bytes, name + ': the hovered band\'s sites add up to its ' + exact.band.bytes + ' bytes (' + exact.band.category + ')');
  await page.evaluate(() => window.cacheallocReport.setView(0, 1e15));
  await page.mouse.move(2, 2);
  const legend = await page.evaluate(() => window.cacheallocReport.legendText || document.getElementById('timeline-legend').textContent);
  check(!/unknown/.test(legend) && legend.includes(fmtBytes(Math.max(...summary.peaks.filter((x) => x.metric === 'allocated').map((x) => x.bytes)))),
        name + ': the legend off the chart shows the peak, not "unknown": ' + JSON.stringify(legend.slice(0, 160)));
  const segs = (got.map ? got.map.segments : []).slice().sort((a, b) => a.size - b.size);
  check(segs.every((s, i) => s.width >= 4 && (i === 0 || s.width >= segs[i - 1].width) && (i === 0 || s.size === segs[i - 1].size || s.width > segs[i - 1].width || s.width === 4)),
        name + ': segments drawn to scale, widths in the order of sizes (' + segs.map((s) => s.size + ':' + (s.width || 0).toFixed(1)).slice(0, 6).join(' ') + ')');
  for (const [id, texts] of Object.entries(got.tables))
    check(new Set(texts).size === texts.length, name + ': the site labels of #' + id + ' are distinct (' + texts.length + ' rows)');
}

// The page's peak panel against `peak --format json`: bytes, categories, sites.
function samePeakPanel(p, peak, name) {
  if (!check(p, name + ': the page has a peak panel')) return;
  check(p.allocated === peak.allocated_bytes, name + ': the peak panel holds ' + p.allocated + ' bytes, peak says ' + peak.allocated_bytes);
  for (const c of peak.categories || [])
    check(p.categories[c.category] === c.bytes, name + ': at the peak, ' + c.category + ' ' + p.categories[c.category] + ' == peak ' + c.bytes);
  const key = (stack, bytes, n) => JSON.stringify([stack, bytes, n]);
  const want = (peak.sites || []).map((x) => key(x.stack, x.bytes, x.allocations)).sort(), have = p.sites.map((x) => key(x.stack, x.bytes, x.allocations)).sort();
  check(JSON.stringify(want) === JSON.stringify(have), name + ': the peak panel\'s sites are those of peak (' + have.length + ' vs ' + want.length + ')');
}

// A page of a trace longer than its detail budget (html --detail-events):
// the whole run from buckets, event by event only inside the detail windows.
async function checkDetailBudget(browser, input, name) {
  const html = path.join(outdir, name + '.detail.html');
  const budget = 20000;
  run(['html', input, '-o', html, '-f', '--detail-events', String(budget)]);
  const summary = json(['summary', input]), peak = json(['peak', input]);
  const { page, problems } = await open(browser, html);
  const ready = await page.waitForFunction(() => window.cacheallocReport && window.cacheallocReport.ready, { timeout: 60000 }).then(() => true, () => false);
  if (!check(ready, name + ' (detail budget): the report became interactive')) { console.log('  ' + problems.join('\n  ')); await page.close(); return; }
  const got = await page.evaluate(() => { const r = window.cacheallocReport;
    return JSON.parse(JSON.stringify({ peak: r.timelinePeak, panel: r.peakPanel, windows: r.detailWindows, points: r.drawnPoints(),
      listed: (document.getElementById('detail-windows') || { textContent: '' }).textContent })); });
  check(got.points > 0 && got.peak === summary.peak_allocated, name + ' (detail budget): the timeline is drawn, its peak ' + got.peak + ' == summary ' + summary.peak_allocated);
  samePeakPanel(got.panel, peak, name + ' (detail budget)');
  const kept = got.windows.reduce((n, w) => n + w.to - w.from + 1, 0);
  check(kept <= budget && kept < summary.at_event + 1, name + ' (detail budget): ' + kept + ' events kept in ' + got.windows.length + ' windows');
  const inside = (e) => got.windows.find((w) => w.from <= e && e <= w.to);
  const peakWindow = inside(summary.peak_allocated_event);
  check(peakWindow && inside(summary.at_event) && got.listed.includes('allocated peak') && got.listed.includes('last events'),
        name + ' (detail budget): the page names windows around the allocated peak and the last events: ' + JSON.stringify(got.listed.slice(0, 300)));
  // Inside a detail window: event by event, as timeline --all-events.
  const a = peakWindow.from, b = Math.min(peakWindow.to, a + 999);
  const zoom = await page.evaluate((a, b) => { const r = window.cacheallocReport; r.setView(a, b); const s = r.seriesSample(b - a + 1);
    return { exact: s.exact, points: s.points.map((p) => [p.event, p.allocated]), note: r.detailNote }; }, a, b);
  const rows = json(['timeline', input, '--all-events', '--from', String(a), '--to', String(b)]).timeline.filter((r) => r.event !== null);
  check(zoom.exact && zoom.points.length === b - a + 1 && zoom.note === '', name + ' (detail budget): events #' + a + ' to #' + b + ' drawn event by event (' + zoom.points.length + ' points)');
  const differ = zoom.points.findIndex((p, j) => !rows[j] || rows[j].event !== p[0] || rows[j].allocated !== p[1]);
  check(rows.length === zoom.points.length && differ < 0, name + ' (detail budget): the zoomed window equals timeline --all-events' + (differ >= 0 ? ' (first difference at #' + zoom.points[differ][0] + ')' : ''));
  const map = await page.evaluate((e) => { const r = window.cacheallocReport; r.selectMoment(e); return JSON.parse(JSON.stringify(r.segmentMap)); }, summary.peak_allocated_event);
  sameMap(map, json(['segments', input, '--at', String(summary.peak_allocated_event)]), name + ' (detail budget) at the peak');
  // Outside every detail window: buckets, and one line saying so.
  let x = 0;
  for (const w of got.windows) if (x >= w.from - 1000 && x <= w.to) x = w.to + 1;
  if (check(x + 999 < summary.at_event, name + ' (detail budget): some events lie outside the detail windows')) {
    const out = await page.evaluate((x) => { const r = window.cacheallocReport; r.setView(x, x + 999); r.selectMoment(x + 10);
      return JSON.parse(JSON.stringify({ exact: r.seriesSample(10).exact, note: r.detailNote, shown: document.getElementById('detail-note').textContent,
        map: r.segmentMap, sites: r.windowSites, mapNote: document.getElementById('segments-note').textContent })); }, x);
    check(!out.exact && /event-level detail kept only for/i.test(out.note) && out.shown === out.note && /timeline --from/.test(out.note),
          name + ' (detail budget): events #' + x + ' to #' + (x + 999) + ' stay at bucket level and say so: ' + JSON.stringify(out.note.slice(0, 200)));
    check(out.map.segments === null && out.map.nearest !== null && /not in this page/.test(out.mapNote) && out.sites.sites === null,
          name + ' (detail budget): the segment map and the sites there say the layout is not in the page and offer the nearest window');
  }
  let status = 0, stderr = '';
  try { execFileSync(analyze, ['html', input, '-o', html, '-f', '--detail-events', '0'], { stdio: 'pipe' }); }
  catch (e) { status = e.status; stderr = e.stderr.toString(); }
  check(status === 2 && stderr.trim().split('\n').length === 1, name + ': html --detail-events 0 is refused with exit 2 and one line (' + status + ', ' + JSON.stringify(stderr) + ')');
  check(problems.length === 0, name + ' (detail budget): no console errors and no requests' + (problems.length ? ':\n    ' + problems.join('\n    ') : ''));
  console.log('ok   ' + name + ' with --detail-events ' + budget + ' (' + fs.statSync(html).size + ' bytes, ' + kept + ' events kept in ' + got.windows.length + ' windows)');
  await page.close();
}

async function checkFlameGraph(browser, input, name) {
  const svg = path.join(outdir, name + '.svg');
  run(['flamegraph', input, '-o', svg, '-f']);
  const { page, problems } = await open(browser, svg);
  const parsed = await page.evaluate(() => ({
    root: document.documentElement.localName, namespace: document.documentElement.namespaceURI,
    errors: document.getElementsByTagName('parsererror').length, frames: document.querySelectorAll('rect').length }));
  check(parsed.root === 'svg' && parsed.namespace === 'http://www.w3.org/2000/svg' && parsed.errors === 0,
        name + ': the flame graph is well-formed SVG (XML parser: ' + JSON.stringify(parsed) + ')');
  check(parsed.frames > 0, name + ': the flame graph draws frames');
  check(problems.length === 0, name + ': the flame graph renders with no errors' + (problems.length ? ':\n    ' + problems.join('\n    ') : ''));
  console.log('ok   ' + name + '.svg (' + parsed.frames + ' rects)');
  await page.close();
}

function checkPerfetto(validate, input, name) {
  const trace = JSON.parse(run(['export', input, '--what', 'perfetto', '-o', '-']));
  check(validate(trace), name + ': the Perfetto JSON passes perfetto.schema.json ' + JSON.stringify(validate.errors || []).slice(0, 300));
  const summary = json(['summary', input]);
  const max = (suffix) => Math.max(0, ...trace.traceEvents.filter((e) => e.ph === 'C' && e.name.endsWith(suffix)).map((e) => e.args.bytes));
  check(max(' allocated') === summary.peak_allocated, name + ': the allocated counter reaches the summary peak');
  known(name, 'reserved', max(' reserved') === summary.peak_reserved,
        name + ': the reserved counter ' + max(' reserved') + ' reaches the summary peak ' + summary.peak_reserved);
  console.log('ok   ' + name + ' perfetto (' + trace.traceEvents.length + ' events)');
}

(async () => {
  fs.mkdirSync(outdir, { recursive: true });
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'cachealloc-chromium-'));
  const browser = await puppeteer.launch({
    executablePath: chromium, headless: true, userDataDir: profile,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
  });
  const validate = new Ajv({ allErrors: false, strict: false }).compile(
    JSON.parse(fs.readFileSync(path.join(__dirname, 'perfetto.schema.json'), 'utf8')));
  try {
    const files = inputs(testdata);
    if (!oneInput) check(files.some((f) => /\.pickle/.test(f)) && files.some((f) => /\.bin/.test(f)), 'testdata holds both snapshots and pickles');
    for (const input of files) {
      const name = path.relative(testdata, input).replace(/[\/]/g, '_');
      // A segments-only pickle has no trace: html refuses it like the trace reports do.
      let traced = true;
      try { execFileSync(analyze, ['summary', input], { stdio: 'pipe' }); } catch (e) { traced = false; }
      if (!traced) {
        // Input the analyzer refuses: html refuses it the same way (exit 2, one line on stderr).
        let status = 0, stderr = '';
        try { execFileSync(analyze, ['html', input, '-o', path.join(outdir, name + '.html'), '-f'], { stdio: 'pipe' }); }
        catch (e) { status = e.status; stderr = e.stderr.toString(); }
        check(status === 2 && stderr.trim().split('\n').length === 1 && stderr.startsWith('cachealloc-analyze: error: '),
              name + ': html refuses it with exit 2 and one line (' + status + ', ' + JSON.stringify(stderr) + ')');
        console.log('ok   ' + name + ' refused');
        continue;
      }
      await checkReport(browser, input, name);
      if (/cnn_train|synthetic_2k_native|varlen_transformer|stacks_all/.test(name)) await checkFlameGraph(browser, input, name);
      checkPerfetto(validate, input, name);
    }
    const long = files.find((f) => /long_train\.pickle/.test(f)) || (oneInput ? files[0] : null);
    if (check(long, 'testdata holds a long trace for the detail budget')) await checkDetailBudget(browser, long, path.relative(testdata, long).replace(/[\/]/g, '_'));
    check(mostKeyframes >= 3, 'some input has three or more keyframes (the most: ' + mostKeyframes + ')');
    const wantMany = oneInput ? 1 : 3;
    check(manyKeyframeInputs >= wantMany, manyKeyframeInputs + ' inputs of three or more keyframes held to segments --at at every moment (want ' + wantMany + ' or more)');
    console.log('page state held to segments --at at ' + momentsChecked + ' moments; ' + manyKeyframeInputs + ' inputs of 3 or more keyframes');
  } finally {
    await browser.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
  console.log(failures === 0 ? 'all checks passed' : failures + ' checks failed');
  process.exit(failures === 0 ? 0 : 1);
})().catch((e) => { console.error(e); process.exit(1); });
