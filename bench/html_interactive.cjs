// Time to interactive of a cachealloc-analyze html report in Debian's headless
// Chromium: from navigation to window.cacheallocReport.ready (the page has
// decoded its data, drawn the timeline, the segment map at the peak, the sites
// and fragmentation), then the time a click (segment map at an event) and a
// brush (zoom, sites of the window) take. Best of --runs.
//
//   node bench/html_interactive.cjs REPORT.html NODE_MODULES [--runs 3] [--screenshots DIR [--flame SVG]]
// NODE_MODULES: <build>/tests/browser-npm/node_modules (test_browser_report's).
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const [report, modules, ...rest] = process.argv.slice(2);
const runs = rest.includes('--runs') ? Number(rest[rest.indexOf('--runs') + 1]) : 3;
const shots = rest.includes('--screenshots') ? rest[rest.indexOf('--screenshots') + 1] : null;
const flame = rest.includes('--flame') ? rest[rest.indexOf('--flame') + 1] : null;  // an SVG to screenshot too
const puppeteer = require(path.resolve(modules, 'puppeteer-core'));

(async () => {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'cachealloc-chromium-'));
  const browser = await puppeteer.launch({
    executablePath: '/usr/bin/chromium', headless: true, userDataDir: profile,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
  });
  const best = { interactive: Infinity, click: Infinity, brush: Infinity };
  let errors = 0, requests = 0;
  for (let r = 0; r < runs; ++r) {
    const page = await browser.newPage();
    await page.setViewport({ width: 1400, height: 1000 });
    const url = 'file://' + path.resolve(report);
    page.on('console', (m) => { if (m.type() === 'error') { ++errors; console.log(m.text()); } });
    page.on('pageerror', (e) => { ++errors; console.log(e.message); });
    page.on('request', (q) => { if (q.url() !== url) ++requests; });
    const t0 = Date.now();
    await page.goto(url, { waitUntil: 'load', timeout: 120000 });
    await page.waitForFunction(() => window.cacheallocReport && window.cacheallocReport.ready, { timeout: 120000, polling: 10 });
    best.interactive = Math.min(best.interactive, Date.now() - t0);
    console.log('page phases (ms since the script started): ' + JSON.stringify(await page.evaluate(() => window.cacheallocReport.timings)));
    const box = await page.evaluate(() => window.cacheallocReport.plotBox());
    let t = Date.now();
    await page.mouse.click(box.x + box.width * 0.8, box.y + box.height / 2);
    await page.evaluate(() => new Promise((done) => requestAnimationFrame(() => done())));
    best.click = Math.min(best.click, Date.now() - t);
    t = Date.now();
    await page.mouse.move(box.x + box.width * 0.4, box.y + box.height / 2);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * 0.5, box.y + box.height / 2, { steps: 10 });
    await page.mouse.up();
    await page.evaluate(() => new Promise((done) => requestAnimationFrame(() => done())));
    best.brush = Math.min(best.brush, Date.now() - t);
    const view = await page.evaluate(() => [window.cacheallocReport.view[0], window.cacheallocReport.view[1], window.cacheallocReport.windowSites.from, window.cacheallocReport.windowSites.to]);
    if (r === 0) console.log('brush window: events #' + view[0] + ' to #' + view[1]);
    if (shots && r === 0) {
      await page.evaluate(() => { window.cacheallocReport.setView(0, Infinity); const p = (window.cacheallocReport.peakEvent); if (p !== null) window.cacheallocReport.selectMoment(p); });
      const shot = async (id, file) => { const e = await page.$('#' + id); await e.screenshot({ path: path.join(shots, file) }); };
      await shot('timeline-panel', 'report_timeline.png');
      await shot('segments-panel', 'report_segment_map.png');
      await shot('sites-panel', 'report_sites.png');
    }
    await page.close();
  }
  if (shots && flame) {
    const page = await browser.newPage();
    await page.setViewport({ width: 1400, height: 700 });
    await page.goto('file://' + path.resolve(flame), { waitUntil: 'load' });
    await (await page.$('svg')).screenshot({ path: path.join(shots, 'report_flamegraph.png') });
    await page.close();
  }
  await browser.close();
  fs.rmSync(profile, { recursive: true, force: true });
  console.log('report: ' + report + ' (' + fs.statSync(report).size + ' bytes)');
  console.log('interactive: ' + best.interactive + ' ms, click: ' + best.click + ' ms, brush: ' + best.brush + ' ms (best of ' + runs + ')');
  console.log('console errors: ' + errors + ', requests: ' + requests);
})().catch((e) => { console.error(e); process.exit(1); });
