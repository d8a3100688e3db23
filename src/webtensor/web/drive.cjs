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
//   {type: "dtype", dtype} / {type: "model", model} / {type: "device", device}
//                                                             picks the dtype / model / device menu's entry
//                                                             (reloads the model); result: the page's model facts
//   {type: "stop_ui", mode: "chat"|"complete", text, maxNewTokens, after, how: "button"|"escape"|"new_chat"}
//                                                             starts a greedy run, waits until `after` pieces
//                                                             have been shown, stops it (Stop, Escape or New
//                                                             chat) and waits until it has ended
//   {type: "blank_message", message}                          a blank message: Send's state, Ctrl+Enter and
//                                                             webtensorApp.send() (nothing may be sent)
//   {type: "reload"}                                          reloads the page; result: its state once ready
// Any task may carry a `name`, copied into its result. Every result has `net`: what the browser received over
// the network during it (CDP's Network events: bytes with headers, by path); `bootNet` is the boot's.
// generate_ui / chat_ui / stop_ui results have `updates`: how often the reply's text changed on screen
// (MutationObserver callbacks: the page's DOM updates as the browser delivered them).
// Options: query: appended to the page's address ("?model=ID&dtype=int8"); webgpu: false starts Chromium
// without WebGPU (no adapter); hideWebgpu: true removes navigator.gpu from the page; expectError:
// true accepts a page that stopped on an error (its state is in `boot`).
// The browser runs on a fresh persistent profile (a disk cache and Cache Storage that reloads keep).
// Writes {boot, bootNet, tasks: [...], console: [...], ms} to CONFIG.results; exits 1 on a failed task.
"use strict";

const fs = require("fs");
const path = require("path");

// The sampling fields of a generate_ui / chat_ui task typed into the page (null: an emptied field; absent: left).
async function fillSampling(page, task) {
  await page.fill("#max-tokens", String(task.maxNewTokens));
  await page.fill("#temperature", String(task.temperature ?? 0));
  for (const [key, sel] of [["topK", "#top-k"], ["topP", "#top-p"], ["seed", "#seed"]]) {
    if (task[key] !== undefined) await page.fill(sel, task[key] === null ? "" : String(task[key]));
  }
}

// Counts the changes of the run's output (#output or #conversation) as the browser delivers them.
async function watchUpdates(page) {
  await page.evaluate(() => {
    const w = window.__updates = { n: 0 };
    if (w.observer) w.observer.disconnect();
    const target = document.body.dataset.mode === "chat" ? "conversation" : "output";
    w.observer = new MutationObserver(() => { w.n += 1; });
    w.observer.observe(document.getElementById(target), { childList: true, characterData: true, subtree: true });
  });
}

const updatesSeen = (page) => page.evaluate(() => { window.__updates.observer.disconnect(); return window.__updates.n; });

// Clicks the button that starts a run (`sel`) and waits until that run has ended; the output's updates.
async function runAndWait(page, sel) {
  const runs = await page.evaluate(() => window.webtensorApp.state.runs);
  await watchUpdates(page);
  await page.click(sel);
  await page.waitForFunction((r) => window.webtensorApp.state.runs > r && !window.webtensorApp.state.busy, runs);
  return updatesSeen(page);
}

// The page's state once ready (or stopped on an error).
function pageState(page) {
  return page.evaluate(() => {
    const s = window.webtensorApp.state;
    const $ = (id) => document.getElementById(id);
    const note = $("adapter-note");
    return { phase: s.phase, info: s.info, model: s.model, error: s.error, status: $("status").textContent,
             weights: $("weights").textContent, dtype: $("dtype").value, modelMenu: $("model").value,
             models: [...$("model").options].map((o) => o.value), dtypes: [...$("dtype").options].map((o) => o.value),
             mode: document.body.dataset.mode, facts: $("model-facts").textContent, speed: $("speed").textContent,
             note: note.textContent, noteShown: getComputedStyle(note).display !== "none",
             tokensLimit: $("max-tokens-limit").textContent, messages: s.messages, download: s.download,
             device: $("device").value, devices: [...$("device").options].map((o) => ({ value: o.value, disabled: o.disabled })),
             turns: [...document.querySelectorAll("#conversation .turn")].map((t) => ({ role: t.dataset.role, text: t.textContent })) };
  });
}

// What the browser receives over the network (CDP): bytes (encoded, with headers) and requests, by path.
async function netMeter(page) {
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Network.enable");
  const urls = new Map();
  let tally = { bytes: 0, requests: 0, byPath: {}, statuses: {} };
  cdp.on("Network.requestWillBeSent", (e) => { urls.set(e.requestId, new URL(e.request.url).pathname); });
  cdp.on("Network.responseReceived", (e) => {
    const p = urls.get(e.requestId);
    if (p) tally.statuses[p] = e.response.status;
  });
  cdp.on("Network.loadingFinished", (e) => {
    const p = urls.get(e.requestId) || "?";
    tally.bytes += e.encodedDataLength;
    tally.requests += 1;
    tally.byPath[p] = (tally.byPath[p] || 0) + e.encodedDataLength;
  });
  return { take() { const t = tally; tally = { bytes: 0, requests: 0, byPath: {}, statuses: {} }; return t; } };
}

async function main() {
  const cfg = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
  const { chromium } = require(path.join(cfg.nodeModules, "playwright-core"));
  const out = { boot: null, tasks: [], console: [], ms: {} };
  const t0 = Date.now();
  const save = () => fs.writeFileSync(cfg.results, JSON.stringify(out, null, 1));
  let browser = null, failed = false;
  try {
    // a persistent profile in a new temporary folder (""), as a person's browser has: a disk cache and Cache
    // Storage that a reload keeps (a context of `launch()` is off the record: its HTTP cache lives in memory)
    browser = await chromium.launchPersistentContext("", {
      executablePath: cfg.chromium,
      headless: true,
      ignoreDefaultArgs: ["--headless"],
      viewport: { width: 1000, height: 760 },
      args: ["--headless=new", "--no-sandbox", "--disable-gpu-sandbox",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]
        .concat(cfg.webgpu === false ? ["--disable-features=WebGPU,Vulkan"] : ["--enable-unsafe-webgpu"])
        .concat(cfg.extraArgs || []),
      timeout: 60000,
    });
    const page = browser.pages()[0] || await browser.newPage();
    page.setDefaultTimeout(cfg.timeoutMs || 120000);
    page.on("console", (m) => out.console.push(`${m.type()}: ${m.text()}`));
    if (cfg.hideWebgpu) {  // a browser without WebGPU at all: navigator.gpu is undefined
      await page.addInitScript(() => Object.defineProperty(Navigator.prototype, "gpu", { get: () => undefined }));
    }
    page.on("pageerror", (e) => out.console.push(`pageerror: ${e.message}`));
    const net = await netMeter(page);
    await page.goto(cfg.url + (cfg.query || ""));
    out.ms.launch = Date.now() - t0;
    await page.waitForFunction(() => ["ready", "error"].includes(document.body.dataset.phase));
    out.boot = await pageState(page);
    out.bootNet = net.take();
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
          res.updates = await runAndWait(page, "#generate");
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
          res.updates = await runAndWait(page, "#send");
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
        } else if (task.type === "stop_ui") {
          const chat = task.mode === "chat";
          await page.click(chat ? "#mode-chat" : "#mode-complete");
          await page.fill(chat ? "#message" : "#prompt", task.text);
          await fillSampling(page, task);
          const runs = await page.evaluate(() => window.webtensorApp.state.runs);
          await watchUpdates(page);
          await page.click(chat ? "#send" : "#generate");
          await page.waitForFunction((n) => window.webtensorApp.state.pieces >= n, task.after);
          res.atStop = await page.evaluate(() => ({ pieces: window.webtensorApp.state.pieces,
                                                   text: document.getElementById("speed").textContent,
                                                   stopShown: getComputedStyle(document.getElementById("stop")).display !== "none",
                                                   newChatEnabled: !document.getElementById("new-chat").disabled,
                                                   fieldsEnabled: !document.getElementById("temperature").disabled }));
          if (task.how === "escape") await page.keyboard.press("Escape");
          else await page.click(task.how === "new_chat" ? "#new-chat" : "#stop");
          await page.waitForFunction((r) => window.webtensorApp.state.runs > r && !window.webtensorApp.state.busy, runs);
          res.updates = await updatesSeen(page);
          Object.assign(res, await page.evaluate(() => ({
            phase: window.webtensorApp.state.phase, result: window.webtensorApp.state.lastResult,
            stopAt: window.webtensorApp.state.stopAt,
            messages: window.webtensorApp.state.messages, status: document.getElementById("status").textContent,
            output: document.getElementById("output").textContent,
            turns: [...document.querySelectorAll("#conversation .turn")].map((t) => ({ role: t.dataset.role, text: t.textContent })),
            stopShown: getComputedStyle(document.getElementById("stop")).display !== "none",
          })));
        } else if (task.type === "blank_message") {
          await page.click("#mode-chat");
          await page.fill("#message", task.message);
          const runs = await page.evaluate(() => window.webtensorApp.state.runs);
          res.sendDisabled = await page.evaluate(() => document.getElementById("send").disabled);
          await page.press("#message", "Control+Enter");
          res.sent = await page.evaluate((m) => window.webtensorApp.send({ message: m }), task.message);
          Object.assign(res, await page.evaluate((r) => ({
            runs: window.webtensorApp.state.runs - r, runError: window.webtensorApp.state.runError,
            errorText: document.getElementById("gen-error").textContent,
            turns: document.querySelectorAll("#conversation .turn").length,
          }), runs));
        } else if (task.type === "reload") {
          await page.reload();
          await page.waitForFunction(() => ["ready", "error"].includes(document.body.dataset.phase));
          res.state = await pageState(page);
        } else if (task.type === "new_chat") {
          await page.click("#new-chat");
          res.turns = await page.evaluate(() => document.querySelectorAll("#conversation .turn").length);
        } else if (["dtype", "model", "device"].includes(task.type)) {
          const loads = await page.evaluate(() => window.webtensorApp.state.loads);
          await page.selectOption(`#${task.type}`, task[task.type]);
          await page.waitForFunction((n) => window.webtensorApp.state.loads > n && !window.webtensorApp.state.busy,
                                     loads);
          Object.assign(res, await page.evaluate(() => ({
            phase: window.webtensorApp.state.phase, model: window.webtensorApp.state.model,
            error: window.webtensorApp.state.error, weights: document.getElementById("weights").textContent,
            dtype: document.getElementById("dtype").value, mode: document.body.dataset.mode,
            speed: document.getElementById("speed").textContent,
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
      res.net = net.take();
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
