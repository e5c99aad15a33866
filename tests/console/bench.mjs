// The console's render time, for `make bench` (tests/benches/report_console.rs): signs in with
// the one-time token, then loads the map LOADS times as a fresh page (HTML, script, style,
// /api/me, /api/map, the render) and prints how long each took until the page said it was
// ready, as one JSON line: {"map": [ms, …]}.
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
    const started = Date.now();
    await page.goto(`${url}/?load=${i}#/map`);
    await page.waitForFunction(() => document.body.dataset.ready === "1", null, { timeout: 60000 });
    map.push(Date.now() - started);
  }
  const tiles = await page.evaluate(() => document.querySelectorAll("[data-agent]").length);
  console.log(JSON.stringify({ map, tiles }));
} finally {
  await browser.close();
}
