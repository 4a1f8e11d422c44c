// Opens the gateway's migration report page in the Debian Chromium (headless, fresh
// profile, no network beyond the page itself) through playwright-core, saves a
// full-page screenshot, and checks the DOM against the report's JSON: one row per
// host, each feature's count and bar, the verdict in words, no script, no request
// other than the page.
//
// Usage: node report.mjs '{"url": ..., "screenshot": ..., "profile": ..., "hosts": [...]}'
// where hosts are the rows of GET /report. Prints one JSON line: {"ok": bool,
// "errors": [...], "rows": [...what the DOM showed...]}; exits 1 when not ok.
import { chromium } from 'playwright-core';

const cfg = JSON.parse(process.argv[2]);
const errors = [];
const fail = (msg) => errors.push(msg);

const context = await chromium.launchPersistentContext(cfg.profile, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ],
  viewport: { width: 1500, height: 300 },
  deviceScaleFactor: 1,
});
let rows = [];
try {
  const page = context.pages()[0] ?? (await context.newPage());
  const requested = [];
  page.on('request', (r) => requested.push(r.url()));
  const consoleErrors = [];
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  const resp = await page.goto(cfg.url, { waitUntil: 'load', timeout: 30000 });
  if (!resp || resp.status() !== 200) fail(`GET ${cfg.url} answered ${resp && resp.status()}`);
  const others = requested.filter((u) => u !== cfg.url);
  if (others.length) fail(`the page requested more than itself: ${others.join(', ')}`);
  if (consoleErrors.length) fail(`console errors: ${consoleErrors.join(' | ')}`);
  if ((await page.locator('script').count()) !== 0) fail('the page carries a script');
  rows = await page.$$eval('tr.host', (trs) => trs.map((tr) => ({
    name: tr.dataset.name,
    version: tr.dataset.version,
    era: tr.dataset.era,
    revision: tr.dataset.revision,
    wire: tr.dataset.wire,
    sessions: Number(tr.querySelector('[data-sessions]')?.dataset.sessions),
    requests: Number(tr.querySelector('[data-requests]')?.dataset.requests),
    features: Object.fromEntries([...tr.querySelectorAll('[data-feature]')].map((f) => [
      f.dataset.feature, Number(f.dataset.count)])),
    bars: Object.fromEntries([...tr.querySelectorAll('[data-feature]')].map((f) => [
      f.dataset.feature, f.querySelector('.fill')?.getBoundingClientRect().width ?? 0])),
    verdict: tr.querySelector('.verdict')?.innerText ?? '',
    visible: tr.getBoundingClientRect().height > 0,
  })));
  if (rows.length !== cfg.hosts.length) fail(`${rows.length} rows on the page, ${cfg.hosts.length} hosts in /report`);
  for (const h of cfg.hosts) {
    const row = rows.find((r) => r.name === h.name && r.version === h.version
      && r.revision === h.revision && r.wire === h.wire);
    if (!row) { fail(`no row for ${h.name} ${h.version} (${h.revision}, ${h.wire})`); continue; }
    if (!row.visible) fail(`the row of ${h.name} is not rendered`);
    if (row.requests !== h.requestTotal) fail(`${h.name}: ${row.requests} requests on the page, ${h.requestTotal} in /report`);
    const want = JSON.stringify(Object.entries(h.features).sort());
    const got = JSON.stringify(Object.entries(row.features).sort());
    if (want !== got) fail(`${h.name}: features ${got} on the page, ${want} in /report`);
    for (const [f, w] of Object.entries(row.bars)) if (!(w > 0)) fail(`${h.name}: the ${f} bar has no width`);
    const words = h.needs.length ? h.needs : [h.verdict];
    for (const w of words) if (!row.verdict.includes(w)) fail(`${h.name}: verdict "${w}" not on the page (${row.verdict})`);
  }
  await page.screenshot({ path: cfg.screenshot, fullPage: true });
} catch (e) {
  fail(String(e && e.stack || e));
} finally {
  await context.close();
}
console.log(JSON.stringify({ ok: errors.length === 0, errors, rows }));
process.exit(errors.length === 0 ? 0 : 1);
