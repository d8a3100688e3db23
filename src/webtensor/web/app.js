// The page's logic: load Pyodide and webtensor, create the WebGPU device, load a model the server
// offers (model/manifest.json), and stream completions or a chat's replies into the page, token by token.
// `window.webtensorApp` exposes the same steps to the headless-Chromium tests (generate, chat,
// op parity, benchmarks, loadModel, stop).
// The model and its weights' dtype come from the address (?model=ID&dtype=float32 | float16 | int8),
// else the server's defaults (its first --model; `webtensor web --dtype`); the menus reload the
// model. A float checkpoint's int8 downloads the server's q8_0 GGUF in place of its safetensors; a
// GGUF file loads as stored.
// Model files are kept in Cache Storage with their ETags: a later visit (or a switch back) uses the copy
// whose ETag the manifest lists without a request, else asks the server with If-None-Match (304: the copy).
// Stop (or Escape) ends a run at the next token, its text kept; a chat is kept per model in localStorage
// until New chat. The device menu (?device=webgpu | cpu) runs the model on WebGPU or on webtensor's CPU device
// (numpy, where the served Pyodide has it); by default the CPU device on a software adapter, where it is faster.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const LIB_DIR = "/home/pyodide/lib";
  const MODEL_DIR = "/home/pyodide/models";
  const MODEL_CACHE = "webtensor-models-v1";  // Cache Storage: model files by URL, with their ETag
  const CHAT_KEY = (id) => `webtensor.chat.${id}`;  // localStorage: a model's conversation
  const state = { phase: "starting", app: null, pyodide: null, busy: false, runs: 0, info: null, model: null,
                  manifest: null, mode: "complete", modeChosen: false, messages: [], lastResult: null,
                  error: null, runError: null, loads: 0, stopRequested: false, clearAfterRun: false,
                  download: null, pieces: 0, tokensChosen: 0, stopAt: null, device: "webgpu", numpy: false };

  // Python on the CPU device never waits on the GPU, so it hands the event loop a turn after each token through this
  // (a task of its own: the page paints the text so far and handles a Stop's click)
  globalThis.webtensorYield = () => new Promise((resolve) => {
    const ch = new MessageChannel();
    ch.port1.onmessage = () => resolve();
    ch.port2.postMessage(null);
  });

  function setPhase(phase, text) {
    state.phase = phase;
    document.body.dataset.phase = phase;
    if (text !== undefined) $("status").textContent = text;
  }

  // While a run or a load is under way: Generate / Send and the menus wait; Stop, New chat (which stops the
  // reply first), the boxes and the fields stay usable.
  function setBusy(busy) {
    state.busy = busy;
    for (const id of ["generate", "send", "model", "dtype", "device"]) $(id).disabled = busy || !state.model;
    $("new-chat").disabled = !state.model;
    if (!busy) $("model").disabled = $("dtype").disabled = $("device").disabled = !state.manifest;
    $("stop").disabled = !(busy && state.phase === "generating");
    updateSend();
  }

  function updateSend() {  // an empty or blank message is not sent
    if (!state.busy && state.model) $("send").disabled = !$("message").value.trim();
  }

  function showError(title, detail) {
    state.error = { title, detail: detail || "" };
    const box = $("error");
    box.textContent = title + (detail ? "\n" + detail : "");
    box.style.display = "block";
    setPhase("error", title);
  }

  function clearError() {
    state.error = null;
    $("error").textContent = "";
    $("error").style.display = "none";
  }

  // A Python exception as {type, message}: its last line "pkg.Type: message", without the traceback.
  function pyErrorParts(e) {
    const lines = String((e && e.message) || e).trim().split("\n").filter((l) => l.trim());
    const last = lines.length ? lines[lines.length - 1] : "unknown error";
    const m = last.match(/^([\w.]+(?:Error|Exception)): (.*)$/);
    return m ? { type: m[1].split(".").pop(), message: m[2] } : { type: "Error", message: last };
  }

  function pyError(e) {
    const p = pyErrorParts(e);
    return p.type === "Error" ? p.message : `${p.message} (${p.type})`;
  }

  // The server gives every file an ETag and `Cache-Control: no-cache`: the browser's HTTP cache keeps it and
  // revalidates it (304) on each use.
  async function fetchOk(url, init) {
    const r = await fetch(url, init);
    if (!r.ok) {
      const why = (await r.text().catch(() => "")).trim();
      throw new Error(`${url}: HTTP ${r.status} ${r.statusText}${why ? ": " + why : ""}`);
    }
    return r;
  }

  async function fetchBytes(url) {
    return new Uint8Array(await (await fetchOk(url)).arrayBuffer());
  }

  async function modelCache() {  // null where Cache Storage is missing (not a secure context) or refused
    try {
      return typeof caches === "undefined" ? null : await caches.open(MODEL_CACHE);
    } catch (e) {
      console.warn(`Cache Storage unavailable: ${e}`);
      return null;
    }
  }

  // A response's body, `onProgress(received, total)` as it arrives (total: Content-Length, else `size`).
  async function readBody(r, size, onProgress) {
    const total = Number(r.headers.get("Content-Length")) || size || 0;
    if (!r.body) return new Uint8Array(await r.arrayBuffer());
    const reader = r.body.getReader(), chunks = [];
    let received = 0;
    onProgress(0, total);
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
      received += value.length;
      onProgress(received, total);
    }
    const out = new Uint8Array(received);
    let at = 0;
    for (const c of chunks) { out.set(c, at); at += c.length; }
    return out;
  }

  // A model file `f` ({name, size, etag}) at `url`: the copy in Cache Storage when its ETag is the manifest's
  // (no request), else a request carrying the copy's ETag (304: the copy), else the download, kept for next
  // time. Resolves to {bytes, source: "cache" | "revalidated" | "network"}.
  async function modelFile(cache, url, f, onProgress) {
    const kept = cache ? await cache.match(url) : undefined;
    const keptTag = kept ? kept.headers.get("ETag") : null;
    if (kept && keptTag && keptTag === f.etag) return { bytes: new Uint8Array(await kept.arrayBuffer()), source: "cache" };
    // with Cache Storage the HTTP cache is bypassed (one copy on disk); without, it keeps and revalidates the file
    const r = await fetch(url, cache ? { cache: "no-store", headers: keptTag ? { "If-None-Match": keptTag } : {} } : {});
    if (r.status === 304 && kept) return { bytes: new Uint8Array(await kept.arrayBuffer()), source: "revalidated" };
    if (!r.ok) {
      const why = (await r.text().catch(() => "")).trim();
      throw new Error(`${url}: HTTP ${r.status} ${r.statusText}${why ? ": " + why : ""}`);
    }
    const bytes = await readBody(r, f.size, onProgress);
    if (cache && r.headers.get("ETag")) {
      const headers = {};
      for (const h of ["ETag", "Last-Modified", "Content-Type"]) if (r.headers.get(h)) headers[h] = r.headers.get(h);
      try {  // a full quota or a refusal: the next visit downloads it again
        await cache.put(url, new Response(bytes, { headers }));
      } catch (e) {
        console.warn(`${url} not kept in Cache Storage: ${e}`);
      }
    }
    return { bytes, source: "network" };
  }

  function fmtBytes(n) {
    return n >= 2 ** 20 ? `${(n / 2 ** 20).toFixed(n >= 2 ** 30 ? 0 : 1)} MiB` : `${(n / 1024).toFixed(0)} KiB`;
  }

  function option(value, text, disabled) {
    const o = document.createElement("option");
    o.value = value;
    o.textContent = text;
    o.disabled = !!disabled;
    return o;
  }

  const entry = (id) => state.manifest.models.find((m) => m.id === id);

  // The dtype menu for a model: a float checkpoint's float32 / float16 / int8, a GGUF file's stored type.
  function fillDtypes(m) {
    const f16 = state.info.features.includes("shader-f16");
    $("dtype").replaceChildren(...m.dtypes.map((d) => m.format === "gguf" ? option(d, `${d} (as stored)`)
      : d === "float16" && !f16 ? option(d, "float16 (no shader-f16)", true)
      : option(d, d === "int8" ? "int8 (q8_0)" : d)));
  }

  async function boot() {
    if (!navigator.gpu) {
      showError("No WebGPU in this browser.",
        "navigator.gpu is missing. Use a browser with WebGPU enabled (Chrome or Edge 113+, Safari 26+, " +
        "or Chromium started with --enable-unsafe-webgpu).");
      return;
    }
    setPhase("loading", "Loading Python (Pyodide)…");
    const t0 = performance.now();
    const pyodide = await loadPyodide({ indexURL: new URL("pyodide/", location.href).href });
    state.pyodide = pyodide;
    setPhase("loading", "Loading webtensor…");
    pyodide.unpackArchive(await fetchBytes("webtensor.zip"), "zip", { extractDir: LIB_DIR });
    pyodide.runPython(`import sys\nif ${JSON.stringify(LIB_DIR)} not in sys.path: sys.path.insert(0, ${JSON.stringify(LIB_DIR)})`);
    state.app = pyodide.pyimport("webtensor.web.app");

    setPhase("loading", "Requesting a WebGPU adapter…");
    try {
      state.info = JSON.parse(await state.app.init.callPromising());
    } catch (e) {
      showError("No WebGPU in this browser.", pyError(e));
      return;
    }
    $("adapter").textContent = `${state.info.adapter} (${state.info.backend}; max binding ${fmtBytes(state.info.binding_bytes)})`;

    state.manifest = await (await fetchOk("model/manifest.json")).json();
    const soft = state.info.fallback || state.info.software;
    const asked = new URLSearchParams(location.search);
    state.device = asked.get("device") || (soft && state.manifest.cpu ? "cpu" : "webgpu");
    const adapter = state.info.adapter.replace(/ \(fallback adapter\)$/, "");
    $("device").replaceChildren(option("webgpu", `WebGPU (${adapter})`),
      option("cpu", state.manifest.cpu ? "CPU (numpy in Pyodide)" : "CPU (needs a Pyodide with numpy)", !state.manifest.cpu));
    $("device").addEventListener("change", () => {
      loadModel($("model").value, $("dtype").value, undefined, $("device").value).catch((e) => console.error(e));
    });
    if (soft) {
      const note = $("adapter-note");
      note.textContent = `WebGPU runs on a ${state.info.fallback ? "software fallback adapter" : "software adapter"} ` +
        `here (${adapter}): on this machine's CPU, many times slower than on a GPU. ` +
        (state.manifest.cpu ? "The page runs models on webtensor's CPU device (numpy in Pyodide) instead, several " +
          "times faster here; the device menu switches. "
          : "A Pyodide with numpy (Pyodide's full release, given to \u201cwebtensor web --pyodide DIR\u201d) would let " +
            "the page use webtensor's CPU device, several times faster here. ") +
        "Turn on the browser's hardware acceleration, or use a machine with a GPU, for real speed.";
      note.style.display = "block";
    }

    $("model").replaceChildren(...state.manifest.models.map((m) => option(m.id, m.name)));
    $("model").addEventListener("change", () => {
      loadModel($("model").value, "").catch((e) => console.error(e));
    });
    $("dtype").addEventListener("change", () => {
      loadModel($("model").value, $("dtype").value).catch((e) => console.error(e));
    });
    await loadModel(asked.get("model") || "", asked.get("dtype") || "", t0);
  }

  // Download model `id` ("" = the server's default) in `dtype` ("" = its default) and load it onto `device`
  // ("webgpu" | "cpu"; absent: the one in use), replacing the model loaded before (and showing the new model's
  // conversation). Resolves to the model's facts (state.model); on failure the page shows the error and
  // state.model is null.
  async function loadModel(id, dtype, t0, device) {
    if (state.busy) throw new Error("generating: load a model when it is done");
    t0 = t0 === undefined ? performance.now() : t0;
    state.loads += 1;
    state.model = null;
    setBusy(true);
    clearError();
    clearRunError();
    showConversation([]);
    $("speed").textContent = "–";  // the previous model's figures do not stay
    setPhase("loading", "Loading the model…");
    const def = state.manifest.default;
    try {
      const m = entry(id || def.model);
      if (!m) throw new Error(`no model ${JSON.stringify(id)} is served (${state.manifest.models.map((x) => x.id).join(", ")})`);
      dtype = dtype || (m.id === def.model ? def.dtype : m.dtypes[0]);
      if (!m.dtypes.includes(dtype)) throw new Error(`${m.name} loads in ${m.dtypes.join(", ")}, not ${dtype}`);
      device = device || state.device;
      if (!["webgpu", "cpu"].includes(device)) throw new Error(`the device is webgpu or cpu, not ${JSON.stringify(device)}`);
      if (device === "cpu" && !state.manifest.cpu) {
        throw new Error("the CPU device needs numpy, which this server's Pyodide does not have (npm's pyodide is " +
                        "core only; give \u201cwebtensor web --pyodide DIR\u201d Pyodide's full release)");
      }
      state.device = device;
      $("device").value = device;
      if (device === "cpu" && !state.numpy) {
        setPhase("loading", "Loading numpy for the CPU device…");
        await state.pyodide.loadPackage("numpy");
        state.numpy = true;
      }
      $("model").value = m.id;
      fillDtypes(m);
      $("dtype").value = dtype;
      const dir = `${MODEL_DIR}/${m.id}/${dtype}`;
      const cache = await modelCache();
      let done = 0, downloaded = 0;
      const sources = {};
      for (const f of m.files[dtype]) {
        setPhase("loading", `Opening ${f.name}…`);
        const onProgress = (received, total) => {
          const pct = total ? Math.min(100, Math.floor(100 * received / total)) : null;
          state.download = { name: f.name, received, total, percent: pct };
          $("status").textContent = `Downloading ${f.name}: ` +
            (pct === null ? fmtBytes(received) : `${pct}% (${fmtBytes(received)} of ${fmtBytes(total)})`) + "…";
        };
        const url = `model/${encodeURIComponent(m.id)}/${f.name.split("/").map(encodeURIComponent).join("/")}`;
        const { bytes, source } = await modelFile(cache, url, f, onProgress);
        const path = `${dir}/${f.name}`;
        state.pyodide.FS.mkdirTree(path.slice(0, path.lastIndexOf("/")));
        state.pyodide.FS.writeFile(path, bytes);
        done += bytes.length;
        if (source === "network") downloaded += bytes.length;
        sources[f.name] = source;
      }
      const onProgress = (name, doneBytes, total) => {
        $("status").textContent = `Loading the weights ${device === "cpu" ? "into memory" : "onto the GPU"}… ` +
          `${Math.round(100 * doneBytes / total)}%`;
      };
      const facts = JSON.parse(await state.app.load_model.callPromising(dir, onProgress, dtype, device));
      Object.assign(facts, { id: m.id, name: m.name, format: m.format, download_bytes: done,
                             downloaded_bytes: downloaded, sources, files: m.files[dtype].map((f) => f.name),
                             float32_bytes: m.format === "gguf" ? null : m.files.float32.reduce((n, f) => n + f.size, 0) });
      state.model = facts;
    } catch (e) {
      $("weights").textContent = "–";
      $("model-facts").textContent = "–";
      showError("Model failed to load.", pyError(e));
      return null;
    } finally {
      setBusy(false);
    }
    const m = state.model;
    $("model-facts").textContent = `${m.name}: ${m.architecture}, ${m.n_layer} layers, ${m.n_embd} wide, ` +
      `${(m.n_params / 1e6).toFixed(2)} M parameters, vocabulary ${m.vocab_size} (tokenizer: ${m.tokenizer}; ` +
      `${m.chat_template ? "its own chat template" : "no chat template: chat uses a plain one"})`;
    const what = m.format === "gguf" ? `${m.dtype} (GGUF, as stored)` : m.dtype === "int8" ? "int8 (q8_0 matrices)"
      : m.dtype === "float16" ? "float16 (matrices)" : "float32";
    const vs = m.dtype === "int8" ? `, ${(m.download_bytes / m.float32_bytes).toFixed(2)}x float32's ` +
      `${fmtBytes(m.float32_bytes)}` : "";
    const got = m.downloaded_bytes === m.download_bytes ? `downloaded ${fmtBytes(m.download_bytes)}${vs}`
      : m.downloaded_bytes === 0 ? `${fmtBytes(m.download_bytes)}${vs}, from this browser's cache`
      : `${fmtBytes(m.download_bytes)}${vs}, ${fmtBytes(m.downloaded_bytes)} of it downloaded, the rest from this browser's cache`;
    const held = m.device === "cpu" ? "in memory (the CPU device)" : "on the GPU";
    $("weights").textContent = `${what}: ${got}; ${fmtBytes(m.weight_bytes)} ${held}`;
    $("weights").title = `files: ${m.files.join(", ")}` + (m.dtype === "float32" ? "" : "; norms and biases stay float32");
    $("max-tokens-limit").textContent = `1–${m.max_new_tokens}`;
    $("max-tokens").title = `new tokens: a whole number from 1 to ${m.max_new_tokens} (and what the context leaves)`;
    showConversation(loadConversation(m.id));
    if (!state.modeChosen) setMode(m.chat_template || state.messages.length ? "chat" : "complete");
    setPhase("ready", `Ready in ${((performance.now() - t0) / 1000).toFixed(1)} s. ` +
      (state.mode === "chat" ? "Type a message and press Send." : "Type a prompt and press Generate."));
    return m;
  }

  function setMode(mode) {
    state.mode = mode;
    document.body.dataset.mode = mode;
    $(`mode-${mode}`).checked = true;
  }

  function clearRunError() {
    state.runError = null;
    $("gen-error").textContent = "";
    $("gen-error").style.display = "none";
  }

  function showRunError(err) {
    state.runError = err;
    $("gen-error").textContent = err.message;
    $("gen-error").dataset.type = err.type;
    $("gen-error").style.display = "block";
  }

  // The form's fields go to Python as typed (text boxes: nothing is emptied before the check): app.check_request /
  // check_chat read them with the API's rules (validate.py), so the page refuses what `webtensor generate`
  // refuses, in its own words: each message names the field's label on screen and what was typed.
  const FIELDS = { maxNewTokens: "max-tokens", temperature: "temperature", topK: "top-k", topP: "top-p", seed: "seed" };

  function takeOptions(opts) {
    for (const [key, id] of Object.entries(FIELDS)) {
      if (opts[key] !== undefined) $(id).value = opts[key] === null ? "" : String(opts[key]);
    }
  }

  // One run (a completion or a chat turn): `call(onPiece, stopRequested, watched)` runs Python; `into` receives
  // the streamed text; `onDone(result)` keeps what the run made (before a New chat asked for during it clears it).
  // Resolves to the run's JSON result; on failure calls `onFail`, shows the error and rethrows.
  async function run(call, into, onFail, onDone) {
    if (!["ready", "done", "stopped", "failed"].includes(state.phase)) throw new Error(`not ready (phase ${state.phase})`);
    if (state.busy) throw new Error("already generating");
    state.runs += 1;
    state.lastResult = null;
    state.stopRequested = false;
    state.pieces = state.tokensChosen = 0;
    state.stopAt = null;
    clearRunError();
    $("speed").textContent = "–";  // no figures from a previous run stay on screen
    setPhase("generating", "Generating… (Stop or Escape ends it)");
    setBusy(true);
    const onPiece = (piece, nTokens, tps) => {
      into().append(piece);
      state.pieces += 1;
      $("speed").textContent = nTokens > 1 ? `${tps.toFixed(1)} tokens/s (${nTokens} tokens)` : `${nTokens} token`;
    };
    // asked by Python after each token; a Stop's click is handled while Python waits for the next one (the GPU),
    // which is then the last
    const stopRequested = () => {
      state.tokensChosen += 1;
      return state.stopRequested;
    };
    try {
      const res = JSON.parse(await call(onPiece, stopRequested, !document.hidden));
      into();
      state.lastResult = res;
      if (onDone) onDone(res);
      const cut = res.truncated_tokens ? `; prompt truncated to its last ${res.prompt_tokens} tokens` : "";
      const seed = res.seed === null ? "" : `; seed ${res.seed}`;
      $("speed").textContent = `${res.tokens_per_s.toFixed(1)} tokens/s decode (${res.new_tokens} tokens; ` +
        `prompt of ${res.prompt_tokens} + first token ${(res.prefill_s * 1000).toFixed(0)} ms${seed}${cut})`;
      if (res.ended === "stopped") {
        setPhase("stopped", `Stopped after ${res.new_tokens} tokens; the text so far is kept.`);
      } else {
        const why = { length: "the token limit", eos: "end of text", stop: "end of turn" }[res.ended];
        setPhase("done", `Done: ${res.new_tokens} tokens (${why}).`);
      }
      return res;
    } catch (e) {
      const err = pyErrorParts(e);
      onFail();
      $("speed").textContent = "–";
      showRunError(err);
      setPhase("failed", `Generation failed (${err.type}).`);
      throw e;
    } finally {
      setBusy(false);
      if (state.clearAfterRun) {
        state.clearAfterRun = false;
        newChat();
      }
    }
  }

  // Stop (the button, Escape, New chat during a reply): the run ends after the token being computed.
  function stop() {
    if (state.busy && state.phase === "generating" && !state.stopRequested) {
      state.stopRequested = true;
      state.stopAt = state.tokensChosen;  // the reply ends with the token after these
    }
    return state.stopRequested;
  }

  const field = (id) => $(id).value;

  // Complete the prompt box's text (options: prompt, the FIELDS, truncate).
  async function generate(opts) {
    opts = opts || {};
    if (opts.prompt !== undefined) $("prompt").value = opts.prompt;
    takeOptions(opts);
    if (opts.truncate !== undefined) $("truncate").checked = !!opts.truncate;
    setMode("complete");
    const prompt = $("prompt").value;
    const out = $("output");
    out.textContent = "";
    let gen = null;
    const into = () => {  // the prompt and the text appear once the inputs passed their checks
      if (!gen) {
        const p = document.createElement("span");
        p.className = "prompt";
        p.textContent = prompt;
        gen = document.createElement("span");
        gen.className = "generated";
        out.append(p, gen);
      }
      return gen;
    };
    return run((onPiece, stopRequested, watched) => state.app.generate.callPromising(
      prompt, field("max-tokens"), field("temperature"), field("seed"), onPiece, field("top-k"), field("top-p"),
      $("truncate").checked, stopRequested, watched), into, () => { out.textContent = ""; });
  }

  function addTurn(role, text) {
    const div = document.createElement("div");
    div.className = `turn ${role}`;
    div.dataset.role = role;
    div.textContent = text;
    $("conversation").append(div);
    return div;
  }

  // Send the message box's text as the user's next turn (options: message, the FIELDS) and stream the
  // model's reply; the conversation (state.messages, kept in localStorage) keeps both, a stopped reply as far
  // as it got. A blank message is not sent: null, and the page says why.
  async function send(opts) {
    opts = opts || {};
    if (opts.message !== undefined) $("message").value = opts.message;
    takeOptions(opts);
    setMode("chat");
    const text = $("message").value;
    if (!text.trim()) {
      showRunError({ type: "SamplingError", message: state.app.EMPTY_MESSAGE });
      return null;
    }
    const user = addTurn("user", text);
    let reply = null;
    const into = () => reply || (reply = addTurn("assistant", ""));
    const messages = state.messages.concat([{ role: "user", content: text }]);
    return run((onPiece, stopRequested, watched) => state.app.chat.callPromising(
      JSON.stringify(messages), field("max-tokens"), field("temperature"), field("seed"), onPiece, field("top-k"),
      field("top-p"), stopRequested, watched), into, () => { user.remove(); if (reply) reply.remove(); },
    (res) => {  // (a reply stopped before its first piece still shows as a turn: `into` made it)
      state.messages = messages.concat([{ role: "assistant", content: res.reply }]);
      saveConversation();
      $("message").value = "";
    });
  }

  function loadConversation(id) {
    try {
      const saved = JSON.parse(localStorage.getItem(CHAT_KEY(id)) || "[]");
      return Array.isArray(saved) ? saved.filter((m) => m && typeof m.role === "string" && typeof m.content === "string") : [];
    } catch (e) {
      return [];  // storage off or an unreadable entry: a new chat
    }
  }

  function saveConversation() {
    if (!state.model) return;
    try {
      if (state.messages.length) localStorage.setItem(CHAT_KEY(state.model.id), JSON.stringify(state.messages));
      else localStorage.removeItem(CHAT_KEY(state.model.id));
    } catch (e) {
      console.warn(`the conversation is not kept across reloads: ${e}`);
    }
  }

  function showConversation(messages) {
    state.messages = messages;
    $("conversation").textContent = "";
    for (const m of messages) addTurn(m.role, m.content);
  }

  // New chat: forget the conversation (here and in storage); during a reply, stop it first.
  function newChat() {
    if (state.busy && state.phase === "generating") {
      state.clearAfterRun = true;
      stop();
      return;
    }
    showConversation([]);
    saveConversation();
    clearRunError();
  }

  async function parity(casesJson) {
    return JSON.parse(await state.app.run_parity.callPromising(casesJson));
  }

  async function bench(optionsJson) {
    return JSON.parse(await state.app.bench.callPromising(optionsJson || "{}"));
  }

  const report = (e) => console.error(e);
  $("generate").addEventListener("click", () => { generate().catch(report); });
  $("send").addEventListener("click", () => { send().catch(report); });
  $("new-chat").addEventListener("click", () => newChat());
  $("stop").addEventListener("click", () => stop());
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && stop()) ev.preventDefault();
  });
  $("message").addEventListener("input", updateSend);
  for (const mode of ["complete", "chat"]) {
    $(`mode-${mode}`).addEventListener("change", () => { state.modeChosen = true; setMode(mode); });
  }
  for (const [box, button] of [["prompt", "generate"], ["message", "send"]]) {
    $(box).addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey) && !$(button).disabled) $(button).click();
    });
  }

  const ready = boot().catch((e) => showError("webtensor failed to start.", String((e && e.message) || e)));
  // Runs Python in the page's interpreter (async, so GPU readbacks work): for tests and debugging.
  async function runPython(code) {
    return state.pyodide.runPythonAsync(code);
  }

  window.webtensorApp = { state, ready, generate, send, newChat, stop, parity, bench, runPython, loadModel };
})();
