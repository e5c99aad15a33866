// The console's render time, for `make bench` (tests/benches/report_console.rs): signs in with
// the one-time token, then loads the map LOADS times as a fresh page (HTML, script, style,
// /api/me, /api/map, the render), then the conversation THREAD as many times (its first page,
// then every page), and prints how long each took until the page said it was ready, as one
// JSON line: {"map": [ms, …], "thread": [ms, …], "thread_all": [ms, …], …}.
import { chromium } from "playwright-core";

const url = process.env.CONSOLE_URL;
const loads = Number(process.env.LOADS || 20);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await (await browser.newContext({ viewport: { width: 1280, height: 860 } })).newPage();
  await page.goto(`${url}/#login=${process.env.ADMIN_TOKEN}`);
  await page.waitForFunction(() => document.body.dataset.ready === "1", null, { timeout: 60000 });
  const map = [];
  for (let i = 0; i < loads; i++) {
    await page.goto("about:blank");
    const started = Date.now();
    await page.goto(`${url}/?load=${i}#/map`);
    await page.waitForFunction(() => document.body.dataset.ready === "1", null, { timeout: 60000 });
    map.push(Date.now() - started);
  }
  const tiles = await page.evaluate(() => document.querySelectorAll("[data-agent]").length);
  // The conversation: time to its first page over fresh loads, then to every page ("Load
  // more" until none). Each load starts from a blank page, so tearing the previous one down
  // (ten thousand cards after an every-page pass) is not counted.
  const thread = [];
  const threadAll = [];
  let records = 0;
  let firstRecords = 0;
  let breakdown = null;
  const blank = async () => page.goto("about:blank");
  for (let i = 0; i < loads && process.env.THREAD; i++) {
    await blank();
    const started = Date.now();
    await page.goto(`${url}/?load=${i}#/thread/${process.env.THREAD}`);
    await page.waitForFunction(() => document.body.dataset.ready === "1", null, { timeout: 60000 });
    thread.push(Date.now() - started);
    if (i === loads - 1) {
      breakdown = await page.evaluate(() => ({
        resources: performance.getEntriesByType("resource").map((r) => [r.name.replace(/^.*\/\/[^/]+/, "").slice(0, 40), Math.round(r.startTime), Math.round(r.duration)]),
        nav: Math.round(performance.getEntriesByType("navigation")[0].domContentLoadedEventEnd),
        now: Math.round(performance.now()),
      }));
    }
    firstRecords = await page.evaluate(() => document.querySelectorAll("#timeline .card").length);
  }
  for (let i = 0; i < 3 && process.env.THREAD; i++) {
    await blank();
    const started = Date.now();
    await page.goto(`${url}/?all=${i}#/thread/${process.env.THREAD}`);
    await page.waitForFunction(() => document.body.dataset.ready === "1", null, { timeout: 60000 });
    for (;;) {
      const more = await page.$("#thread-more:not([hidden])");
      if (!more) break;
      const before = await page.evaluate(() => document.querySelectorAll("#timeline .card").length);
      await more.click();
      await page.waitForFunction((n) => document.querySelectorAll("#timeline .card").length > n || document.querySelector("#thread-more[hidden]"), before, { timeout: 60000 });
    }
    threadAll.push(Date.now() - started);
    records = await page.evaluate(() => document.querySelectorAll("#timeline .card").length);
  }
  // The API alone (no render), for where the time goes.
  const api = await page.evaluate(async (id) => {
    const time = async (path) => { const t = performance.now(); const r = await fetch(path); await r.text(); return Math.round(performance.now() - t); };
    return { map: await time("/api/map"), thread: id ? await time("/api/thread?id=" + id) : 0 };
  }, process.env.THREAD || "");
  console.log(JSON.stringify({ map, tiles, thread, thread_all: threadAll, records, first_records: firstRecords, api, breakdown }));
} finally {
  await browser.close();
}
