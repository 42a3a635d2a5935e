// Drives Osprey's page (GET /) in headless Chromium, as a person would: enters the admin key,
// waits for a chart to update from /metrics, sends a playground message and reads the streamed
// answer, opens that request in the request log, and saves a screenshot of the overview.
// Usage: node dashboard-check.cjs URL ADMIN_KEY SCREENSHOT.png   (OSPREY_PLAYWRIGHT: the
// playwright-core module's directory, from scripts/browser-kit.sh). Prints a JSON summary.
const { chromium } = require(process.env.OSPREY_PLAYWRIGHT || "playwright-core");

(async () => {
  const [url, key, shot] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: process.env.OSPREY_CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage({ viewport: { width: 1440, height: 1000 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(url);
  await page.fill("#key", key);
  await page.dispatchEvent("#key", "change");
  const updates = () => page.evaluate(() =>
    Math.max(...[...document.querySelectorAll("canvas")].map((c) => Number(c.dataset.updates || 0))));
  await page.waitForFunction(() =>
    [...document.querySelectorAll("canvas")].some((c) => Number(c.dataset.updates || 0) >= 2), null, { timeout: 30000 });
  const before = await updates();

  await page.click('nav button[data-tab="playground"]');
  await page.waitForFunction(() => document.querySelector("#p-model").options.length > 0, null, { timeout: 30000 });
  await page.fill("#p-message", "Tell me one thing about ospreys.");
  await page.click("#p-send");
  await page.waitForFunction(() => document.querySelector("#p-status").textContent.startsWith("done"), null, { timeout: 180000 });
  const answer = await page.textContent("#answer");

  await page.click('nav button[data-tab="requests"]');
  await page.waitForSelector("#rows tr", { timeout: 30000 });
  await page.click("#rows tr");
  await page.waitForSelector("#detail h2", { timeout: 30000 });
  const detail = await page.textContent("#detail");

  await page.click('nav button[data-tab="overview"]');
  await page.waitForFunction((n) =>
    Math.max(...[...document.querySelectorAll("canvas")].map((c) => Number(c.dataset.updates || 0))) >= n + 2, before, { timeout: 30000 });
  const tokens = await page.evaluate(() => document.querySelector('canvas[data-chart="Tokens per second"]').dataset.updates);
  await page.screenshot({ path: shot, fullPage: true });
  console.log(JSON.stringify({ answer, detail, errors, chart_updates: Number(tokens), before }));
  await browser.close();
})().catch((e) => { console.error(e); process.exit(1); });
