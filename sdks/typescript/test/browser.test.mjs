// The default entries of both packages in headless Chromium (Debian's
// chromium, driven by puppeteer-core from tests/npm, as the inspector's
// tests do): loaded as ES modules with an import map and no bundler (so
// neither may import a Node built-in), against a real server started with
// `--cors-allow-origin` for the page's origin. Skipped, with the reason,
// when Chromium or puppeteer-core is missing (scripts/test installs both).
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, extname, join, normalize, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { startServer } from "./server.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const packages = resolve(here, "..", "packages");
const chromium = process.env.CHROMIUM ?? "/usr/bin/chromium";

function loadPuppeteer() {
  const require = createRequire(import.meta.url);
  const candidates = [process.env.PUPPETEER_CORE, resolve(here, "..", "..", "..", "tests", "npm", "node_modules", "puppeteer-core")];
  for (const candidate of candidates) {
    if (candidate === undefined) continue;
    try {
      return require(candidate);
    } catch {
      // next
    }
  }
  return undefined;
}

const PAGE = `<!doctype html>
<meta charset="utf-8">
<title>sandbox-agent in a browser</title>
<script type="importmap">
{"imports": {
  "sandbox-agent": "/packages/sandbox-agent/dist/index.js",
  "acp-http-client": "/packages/acp-http-client/dist/index.js"
}}
</script>
<script type="module" src="/page.mjs"></script>
`;

const TYPES = { ".js": "text/javascript", ".mjs": "text/javascript", ".map": "application/json" };

/** Serves the page, page.mjs and the packages' dist/ on a free loopback port. */
async function startPageServer() {
  const http = createServer((request, response) => {
    const path = new URL(request.url, "http://x").pathname;
    let file;
    if (path === "/") {
      response.writeHead(200, { "content-type": "text/html" });
      return response.end(PAGE);
    }
    if (path === "/page.mjs") file = join(here, "browser", "page.mjs");
    const match = /^\/packages\/(acp-http-client|sandbox-agent)\/dist\/(.+)$/.exec(path);
    if (match) {
      const dist = join(packages, match[1], "dist");
      const candidate = normalize(join(dist, match[2]));
      if (candidate.startsWith(dist + "/")) file = candidate;
    }
    if (file === undefined || !existsSync(file)) {
      response.writeHead(404);
      return response.end();
    }
    response.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream" });
    response.end(readFileSync(file));
  });
  await new Promise((resolve) => http.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${http.address().port}`, close: () => new Promise((resolve) => http.close(resolve)) };
}

test("in headless Chromium: a token, a permission round trip, a question, a resumed stream, files (seed 001's shapes too), a process, the WebSocket transport, a 404", async (t) => {
  const puppeteer = loadPuppeteer();
  if (puppeteer === undefined) return t.skip("puppeteer-core not found (npm install --prefix tests/npm)");
  if (!existsSync(chromium)) return t.skip(`no Chromium at ${chromium} (set CHROMIUM)`);

  const page = await startPageServer();
  const token = "browser-token";
  const server = await startServer(["--cors-allow-origin", page.url, "--token", token]);
  const dir = mkdtempSync(join(tmpdir(), "sa-ts-browser-"));
  const browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    // Chromium took more than puppeteer's 30 s default to start once, on a
    // loaded 2-core machine (tests/v2_api/fixtures/cross_site.mjs).
    timeout: 120_000,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const tab = await browser.newPage();
    const problems = [];
    tab.on("pageerror", (error) => problems.push(`page error: ${error.message}`));
    tab.on("requestfailed", (request) => {
      // The test cuts one event stream on purpose; anything else failing is news.
      if (!request.url().endsWith("/v2/rpc")) problems.push(`request failed: ${request.url()}`);
    });
    const query = new URLSearchParams({ server: server.url, dir, token });
    await tab.goto(`${page.url}/?${query}`);
    await tab.waitForFunction(() => window.__report !== undefined, { timeout: 60_000 });
    const report = await tab.evaluate(() => window.__report);
    assert.equal(report.error, undefined, report.error);
    assert.deepEqual(problems, []);
    assert.deepEqual(report, {
      unauthorized: true,
      health: "ok",
      permissionText: "Permission granted.",
      stopReason: "end_turn",
      asked: ["Write to mock.txt"],
      metadata: { from: "browser" },
      file: "written by a browser",
      entries: ["from-browser.txt"],
      seedEntries: ["from-browser.txt:file", "seed:directory"],
      startError: "SandboxAgent.start: starting a server needs Node.js (it runs the sandbox-agent binary); elsewhere use connect({baseUrl})",
      notFound: true,
      questionText: "You answered: name=Browser color=blue confirm=false",
      process: "0:from a process\n",
      websocketText: "Permission denied.",
      resumedText: "chunk-1 chunk-2 chunk-3 chunk-4 chunk-5 ",
    });
  } finally {
    await browser.close();
    await server.stop();
    await page.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
