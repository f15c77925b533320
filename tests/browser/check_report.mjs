// Opens report.html files in headless Chromium and says what the browser saw, as JSON on stdout.
//
//   node check_report.mjs CHROMIUM PAGES.json
//
// PAGES.json: [{"html": "/abs/report.html", "screenshot": "/abs/shot.png" | null, "full_page": false}, ...]
// For each page: console errors, page errors, every request made, dialogs opened (alert() from injected markup),
// what the page holds (chart SVGs, finding cards, <script> elements) and the text of the first screen.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { chromium } from "playwright-core";

const [executablePath, pagesFile] = process.argv.slice(2);
const pages = JSON.parse(readFileSync(pagesFile, "utf8"));
const FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync"];
const VIEWPORT = { width: 1280, height: 900 };

const browser = await chromium.launch({ executablePath, args: FLAGS, headless: true });
const results = [];
try {
  for (const spec of pages) {
    const context = await browser.newContext({ viewport: VIEWPORT, javaScriptEnabled: true });
    const page = await context.newPage();
    const seen = { url: pathToFileURL(spec.html).href, console_errors: [], page_errors: [], requests: [], dialogs: [] };
    page.on("console", (msg) => { if (msg.type() === "error") seen.console_errors.push(msg.text()); });
    page.on("pageerror", (err) => seen.page_errors.push(String(err)));
    page.on("request", (req) => seen.requests.push(req.url()));
    page.on("dialog", async (dialog) => { seen.dialogs.push(`${dialog.type()}: ${dialog.message()}`); await dialog.dismiss(); });
    await page.goto(seen.url, { waitUntil: "load" });
    await page.waitForTimeout(200); // anything the page would start late (it should start nothing)
    Object.assign(seen, await page.evaluate(() => {
      const visible = (el) => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
      return {
        title: document.title,
        scripts: document.querySelectorAll("script").length,
        charts: [...document.querySelectorAll("svg.chart")].filter(visible).map((svg) => ({
          cls: svg.getAttribute("class"), shapes: svg.querySelectorAll("rect, polyline, circle").length,
          titles: svg.querySelectorAll("title").length, width: Math.round(svg.getBoundingClientRect().width),
        })),
        cards: [...document.querySelectorAll("article.finding")].filter(visible).map((a) => ({
          id: a.id, severity: [...a.classList].find((c) => c !== "finding"),
          has_source: !!a.querySelector("pre.source .line.hl"), has_doc: !!a.querySelector("details.doc p"),
          has_evidence: !!a.querySelector("table.evidence"),
        })),
        // What a reader sees before scrolling: the text of the elements that end above the fold.
        first_screen: [...document.querySelectorAll(".verdict, .top-problems li > a, .top-problems .cost, .top-problems .at, .top-problems pre, .healthy-note")]
          .filter((el) => visible(el) && el.getBoundingClientRect().bottom <= window.innerHeight)
          .map((el) => el.innerText.trim()),
        windows: [...document.querySelectorAll("table.windows tbody tr")].filter(visible).map((tr) => ({
          cells: [...tr.querySelectorAll("td")].map((td) => td.innerText.trim()), bars: tr.querySelectorAll(".cell-bar").length,
        })),
        viewport_height: window.innerHeight,
      };
    }));
    if (spec.screenshot) await page.screenshot({ path: spec.screenshot, fullPage: !!spec.full_page });
    results.push(seen);
    await context.close();
  }
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(results, null, 1) + "\n");
