// The console in a real headless Chromium (Debian's, driven by playwright-core), run by
// tests/console.rs, which owns the fabric: this script asks it for each change it needs by
// printing `need <what> [arg]` and waits for `ok <value>` on stdin. Any dialog, page error or
// console error fails the run: hostile text must stay text.
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";
import { mkdirSync } from "node:fs";

const url = process.env.CONSOLE_URL;
const shots = process.env.SCREENSHOTS;
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

async function need(what, arg) {
  console.log(`need ${what}${arg === undefined ? "" : " " + arg}`);
  const { value, done } = await lines.next();
  if (done || !value.startsWith("ok")) throw new Error(`the harness did not do ${what}: ${value}`);
  return value.slice(3).trim();
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const failures = [];
const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
const page = await context.newPage();
page.on("dialog", (dialog) => { failures.push("dialog: " + dialog.message()); dialog.dismiss(); });
page.on("pageerror", (err) => failures.push("page error: " + err.message));
page.on("console", (msg) => { if (msg.type() === "error") failures.push("console error: " + msg.text()); });
page.on("request", (request) => {
  if (!request.url().startsWith(url)) failures.push("request off the console: " + request.url());
});

async function view(hash) {
  await page.evaluate((h) => { location.hash = h; }, hash);
  await page.waitForFunction(() => document.body.dataset.ready === "1");
}

async function shot(name) {
  if (shots) {
    mkdirSync(shots, { recursive: true });
    await page.screenshot({ path: `${shots}/console-${name}.png`, fullPage: false });
  }
}

// Nothing an agent wrote became markup, a script or a link.
async function inert() {
  const found = await page.evaluate(() => ({
    img: document.querySelectorAll("main img, main svg, main iframe, main object").length,
    scripts: [...document.scripts].map((s) => s.src),
    jsLinks: document.querySelectorAll('a[href^="javascript"]').length,
    styles: document.querySelectorAll("main style").length,
    pwned: window.pwned === true,
  }));
  check(found.img === 0, "an element made from agent text: " + JSON.stringify(found));
  check(found.scripts.length === 1 && found.scripts[0].endsWith("/app.js"), "a script appeared: " + found.scripts);
  check(found.jsLinks === 0 && found.styles === 0 && !found.pwned, "agent text became active: " + JSON.stringify(found));
  const stray = await page.evaluate(() => [...document.getElementById("main").childNodes].some((n) => n.textContent === "null"));
  check(!stray, "a view shows a stray null");
}

async function shows(text) {
  const body = await page.evaluate(() => document.body.innerText);
  check(body.includes(text), `the page does not show ${JSON.stringify(text)}`);
}

try {
  // 1. The one-time link signs the administrator in; the token leaves the address bar.
  await page.goto(`${url}/#login=${process.env.ADMIN_TOKEN}`);
  await page.waitForFunction(() => document.body.dataset.ready === "1");
  check(!page.url().includes("login="), "the token stayed in the address bar");
  await page.waitForSelector('[data-agent="deployer"]');
  await shows(process.env.HOSTILE_DESCRIPTION);
  await inert();
  await shot("map");

  // 2. An agent comes online, then goes offline, with no reload.
  await need("online", "newcomer");
  await page.waitForSelector('[data-agent="newcomer"][data-status="idle"]', { timeout: 10000 });
  await need("offline", "newcomer");
  await page.waitForSelector('[data-agent="newcomer"][data-status="offline"]', { timeout: 10000 });

  // 3. The conversation of a call, from the audit trail.
  const call = await need("conversation");
  await view(`#/thread/${call}`);
  await page.waitForSelector('#timeline .card');
  await shows(process.env.HOSTILE_BODY);
  await inert();
  await shot("conversation");

  // 4. Dead letters: redrive one back to its inbox.
  const seq = await need("dead-letter");
  await view("#/dlq");
  await page.waitForSelector(`[data-seq="${seq}"]`);
  await shot("dead-letters");
  await page.click(`[data-seq="${seq}"] [data-action="redrive"]`);
  await page.waitForFunction((s) => !document.querySelector(`[data-seq="${s}"]`), seq);
  await need("redriven", seq);

  // 4b. A task tree: see it, cancel it as an operator; every task in it ends.
  const root = await need("tree");
  await view(`#/task/${root}`);
  await page.waitForSelector('#tree tr[data-task][data-state="working"]');
  check((await page.locator("#tree tr[data-task]").count()) === 2, "the tree shows its two tasks");
  await shot("tasks");
  await page.fill("#cancel-reason", "release <i>frozen</i>");
  await page.click(`#tree tr[data-task="${root}"] [data-action="cancel"]`);
  await page.waitForFunction(() => document.querySelectorAll('#tree tr[data-state="canceled"]').length === 2);
  await need("canceled", root);

  // 4c. Talk to an agent: a call from the page, its answer read there.
  await need("helpdesk");
  await view("#/talk/helpdesk");
  await page.fill("#talk-message", "is the build green?");
  await page.click('[data-action="call"]');
  await page.waitForSelector('#talk [data-kind="response"]', { timeout: 15000 });
  await shows("on it: is the build green?");
  await inert();
  await shot("talk");

  // 5. Alice signs in with her token and answers a question: the agent resumes.
  await page.click("#signout");
  await page.waitForSelector("#token");
  await page.fill("#token", process.env.ALICE_TOKEN);
  await page.click('form button[type="submit"]');
  await page.waitForSelector("#nav:not([hidden])");
  const ask = await need("ask");
  await view("#/inbox");
  await page.waitForSelector(`[data-item="${ask}"]`);
  await shows(process.env.HOSTILE_QUESTION);
  await inert();
  await shot("inbox");
  await page.fill(`[data-item="${ask}"] textarea`, "yes, roll back");
  await page.click(`[data-item="${ask}"] [data-action="answer"]`);
  await page.waitForFunction((id) => !document.querySelector(`[data-item="${id}"]`), ask);
  await need("answered", ask);

  // 6. Approve an action; a use with changed arguments is refused, the exact one passes.
  const approval = await need("approval");
  await view("#/inbox");
  await page.waitForSelector(`[data-item="${approval}"]`);
  await shows(process.env.HOSTILE_ARGUMENT);
  await inert();
  await shot("approval");
  await page.click(`[data-item="${approval}"] [data-action="approve"]`);
  await page.waitForFunction((id) => !document.querySelector(`[data-item="${id}"]`), approval);
  await need("approved", approval);

  // 7. Escalation after its delay moves an item from alice to carol, live.
  const escalating = await need("escalating");
  await view("#/inbox");
  await page.waitForSelector(`[data-item="${escalating}"]`);
  await page.waitForSelector(`[data-item="${escalating}"]`, { state: "detached", timeout: 15000 });
  await view("#/inbox/done");
  await shot("inbox-done");

  check(failures.length === 0, failures.join("\n"));
  console.log("done");
} catch (err) {
  console.log("failed " + String(err && err.stack || err).replace(/\n/g, " | "));
  if (failures.length) console.log("failed " + failures.join(" | "));
  process.exitCode = 1;
} finally {
  await browser.close();
  // stdin stays open on the harness's side: leave without waiting for it.
  process.exit(process.exitCode || 0);
}
