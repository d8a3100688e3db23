// Drives the webtensor page in real headless Chromium through playwright-core (no browser
// download: Debian's chromium binary is launched). Used by `webtensor.web.headless`.
//
//   node drive.cjs CONFIG.json
// CONFIG: {url, chromium, nodeModules, results, timeoutMs, tasks: [...]} where a task is
//   {type: "generate_ui", prompt, maxNewTokens, temperature, [topK, topP, seed, truncate, expectFail]}
//                                                             types into the page and clicks Generate;
//                                                             expectFail: the run must end in an error
//   {type: "parity", cases}                                   cases: a JSON string (selftest.run_cases)
//   {type: "bench", options}                                  options: a JSON string (app.bench)
//   {type: "screenshot", path}
//   {type: "python", code}                                    runs Python in the page (runPythonAsync)
//   {type: "chat_ui", message, maxNewTokens, temperature, [topK, topP, seed, expectFail]}
//                                                             types a chat message and clicks Send
//   {type: "new_chat"}                                        clicks New chat
//   {type: "dtype", dtype} / {type: "model", model}           picks the dtype / model menu's entry (reloads
//                                                             the model); result: the page's model facts
// Any task may carry a `name`, copied into its result.
// Options: query: appended to the page's address ("?model=ID&dtype=int8"); webgpu: false starts Chromium
// without WebGPU (no adapter); hideWebgpu: true removes navigator.gpu from the page; expectError:
// true accepts a page that stopped on an error (its state is in `boot`).
// Writes {boot, tasks: [...], console: [...], ms} to CONFIG.results; exits 1 on a failed task.
"use strict";

const fs = require("fs");
const path = require("path");

// The sampling fields of a generate_ui / chat_ui task typed into the page (null: an emptied field; absent: left).
async function fillSampling(page, task) {
  await page.fill("#max-tokens", String(task.maxNewTokens));
  await page.fill("#temperature", String(task.temperature || 0));
  for (const [key, sel] of [["topK", "#top-k"], ["topP", "#top-p"], ["seed", "#seed"]]) {
    if (task[key] !== undefined) await page.fill(sel, task[key] === null ? "" : String(task[key]));
  }
}

// Clicks the button that starts a run (`sel`) and waits until that run has ended.
async function runAndWait(page, sel) {
  const runs = await page.evaluate(() => window.webtensorApp.state.runs);
  await page.click(sel);
  await page.waitForFunction((r) => window.webtensorApp.state.runs > r && !window.webtensorApp.state.busy, runs);
}

async function main() {
  const cfg = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
  const { chromium } = require(path.join(cfg.nodeModules, "playwright-core"));
  const out = { boot: null, tasks: [], console: [], ms: {} };
  const t0 = Date.now();
  const save = () => fs.writeFileSync(cfg.results, JSON.stringify(out, null, 1));
  let browser = null, failed = false;
  try {
    browser = await chromium.launch({
      executablePath: cfg.chromium,
      headless: true,
      ignoreDefaultArgs: ["--headless"],
      // playwright adds a new temporary profile (--user-data-dir) itself
      args: ["--headless=new", "--no-sandbox", "--disable-gpu-sandbox",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]
        .concat(cfg.webgpu === false ? ["--disable-features=WebGPU,Vulkan"] : ["--enable-unsafe-webgpu"])
        .concat(cfg.extraArgs || []),
      timeout: 60000,
    });
    const page = await browser.newPage({ viewport: { width: 1000, height: 760 } });
    page.setDefaultTimeout(cfg.timeoutMs || 120000);
    page.on("console", (m) => out.console.push(`${m.type()}: ${m.text()}`));
    if (cfg.hideWebgpu) {  // a browser without WebGPU at all: navigator.gpu is undefined
      await page.addInitScript(() => Object.defineProperty(Navigator.prototype, "gpu", { get: () => undefined }));
    }
    page.on("pageerror", (e) => out.console.push(`pageerror: ${e.message}`));
    await page.goto(cfg.url + (cfg.query || ""));
    out.ms.launch = Date.now() - t0;
    await page.waitForFunction(() => ["ready", "error"].includes(document.body.dataset.phase));
    out.boot = await page.evaluate(() => {
      const s = window.webtensorApp.state;
      const $ = (id) => document.getElementById(id);
      return { phase: s.phase, info: s.info, model: s.model, error: s.error, status: $("status").textContent,
               weights: $("weights").textContent, dtype: $("dtype").value, modelMenu: $("model").value,
               models: [...$("model").options].map((o) => o.value), dtypes: [...$("dtype").options].map((o) => o.value),
               mode: document.body.dataset.mode, facts: $("model-facts").textContent };
    });
    out.ms.boot = Date.now() - t0;
    if (out.boot.phase !== "ready" && !cfg.expectError) {
      throw new Error(`the page did not get ready: ${JSON.stringify(out.boot.error)}`);
    }

    for (const task of cfg.tasks) {
      const ts = Date.now();
      const res = { type: task.type, name: task.name };
      try {
        if (task.type === "generate_ui") {
          await page.click("#mode-complete");
          await page.fill("#prompt", task.prompt);
          await fillSampling(page, task);
          if (task.truncate !== undefined) await page.setChecked("#truncate", !!task.truncate);
          await runAndWait(page, "#generate");
          Object.assign(res, await page.evaluate(() => {
            const gen = document.querySelector("#output .generated");
            const err = document.getElementById("gen-error");
            return {
              phase: window.webtensorApp.state.phase,
              result: window.webtensorApp.state.lastResult,
              runError: window.webtensorApp.state.runError,
              errorText: err.textContent,
              errorShown: getComputedStyle(err).display !== "none",
              output: document.getElementById("output").textContent,
              generated: gen ? gen.textContent : null,
              speed: document.getElementById("speed").textContent,
              status: document.getElementById("status").textContent,
            };
          }));
          if (task.expectFail ? res.phase !== "failed" : res.phase !== "done") {
            throw new Error(`generation ${task.expectFail ? "did not fail" : "failed"}: ${res.status} ${res.errorText}`);
          }
        } else if (task.type === "parity") {
          res.results = await page.evaluate((c) => window.webtensorApp.parity(c), task.cases);
        } else if (task.type === "bench") {
          res.results = await page.evaluate((o) => window.webtensorApp.bench(o), task.options || "{}");
        } else if (task.type === "python") {
          res.results = await page.evaluate((c) => window.webtensorApp.runPython(c), task.code);
        } else if (task.type === "chat_ui") {
          await page.click("#mode-chat");
          await page.fill("#message", task.message);
          await fillSampling(page, task);
          await runAndWait(page, "#send");
          Object.assign(res, await page.evaluate(() => {
            const err = document.getElementById("gen-error");
            const turns = [...document.querySelectorAll("#conversation .turn")];
            return {
              phase: window.webtensorApp.state.phase,
              result: window.webtensorApp.state.lastResult,
              runError: window.webtensorApp.state.runError,
              errorText: err.textContent,
              errorShown: getComputedStyle(err).display !== "none",
              turns: turns.map((t) => ({ role: t.dataset.role, text: t.textContent })),
              messages: window.webtensorApp.state.messages,
              speed: document.getElementById("speed").textContent,
              status: document.getElementById("status").textContent,
            };
          }));
          if (task.expectFail ? res.phase !== "failed" : res.phase !== "done") {
            throw new Error(`chat ${task.expectFail ? "did not fail" : "failed"}: ${res.status} ${res.errorText}`);
          }
        } else if (task.type === "new_chat") {
          await page.click("#new-chat");
          res.turns = await page.evaluate(() => document.querySelectorAll("#conversation .turn").length);
        } else if (task.type === "dtype" || task.type === "model") {
          const loads = await page.evaluate(() => window.webtensorApp.state.loads);
          await page.selectOption(task.type === "dtype" ? "#dtype" : "#model", task[task.type]);
          await page.waitForFunction((n) => window.webtensorApp.state.loads > n && !window.webtensorApp.state.busy,
                                     loads);
          Object.assign(res, await page.evaluate(() => ({
            phase: window.webtensorApp.state.phase, model: window.webtensorApp.state.model,
            error: window.webtensorApp.state.error, weights: document.getElementById("weights").textContent,
            dtype: document.getElementById("dtype").value, mode: document.body.dataset.mode,
          })));
          if (res.phase !== "ready") throw new Error(`loading ${task[task.type]} failed: ${JSON.stringify(res.error)}`);
        } else if (task.type === "screenshot") {
          await page.screenshot({ path: task.path, fullPage: true });
          res.path = task.path;
        } else {
          throw new Error(`unknown task type ${task.type}`);
        }
      } catch (e) {
        res.error = String((e && e.stack) || e);
        failed = true;
      }
      res.ms = Date.now() - ts;
      out.tasks.push(res);
      save();
    }
  } catch (e) {
    out.error = String((e && e.stack) || e);
    failed = true;
  } finally {
    out.ms.total = Date.now() - t0;
    save();
    if (browser) await browser.close().catch(() => {});
  }
  process.exit(failed ? 1 : 0);
}

main().catch((e) => { console.error(e); process.exit(2); });
