// The page's logic: load Pyodide and webtensor, create the WebGPU device, load a model the server
// offers (model/manifest.json), and stream completions or a chat's replies into the page.
// `window.webtensorApp` exposes the same steps to the headless-Chromium tests (generate, chat,
// op parity, benchmarks, loadModel).
// The model and its weights' dtype come from the address (?model=ID&dtype=float32 | float16 | int8),
// else the server's defaults (its first --model; `webtensor web --dtype`); the menus reload the
// model. A float checkpoint's int8 downloads the server's q8_0 GGUF in place of its safetensors; a
// GGUF file loads as stored.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const LIB_DIR = "/home/pyodide/lib";
  const MODEL_DIR = "/home/pyodide/models";
  const state = { phase: "starting", app: null, pyodide: null, busy: false, runs: 0, info: null, model: null,
                  manifest: null, mode: "complete", modeChosen: false, messages: [], lastResult: null,
                  error: null, runError: null, loads: 0 };

  function setPhase(phase, text) {
    state.phase = phase;
    document.body.dataset.phase = phase;
    if (text !== undefined) $("status").textContent = text;
  }

  function setBusy(busy) {
    state.busy = busy;
    for (const id of ["generate", "send", "new-chat", "model", "dtype"]) $(id).disabled = busy || !state.model;
    if (!busy) $("model").disabled = $("dtype").disabled = !state.manifest;
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

  async function fetchOk(url) {
    const r = await fetch(url, { cache: "no-cache" });
    if (!r.ok) {
      const why = (await r.text().catch(() => "")).trim();
      throw new Error(`${url}: HTTP ${r.status} ${r.statusText}${why ? ": " + why : ""}`);
    }
    return r;
  }

  async function fetchBytes(url) {
    return new Uint8Array(await (await fetchOk(url)).arrayBuffer());
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
    $("model").replaceChildren(...state.manifest.models.map((m) => option(m.id, m.name)));
    $("model").addEventListener("change", () => {
      loadModel($("model").value, "").catch((e) => console.error(e));
    });
    $("dtype").addEventListener("change", () => {
      loadModel($("model").value, $("dtype").value).catch((e) => console.error(e));
    });
    const asked = new URLSearchParams(location.search);
    await loadModel(asked.get("model") || "", asked.get("dtype") || "", t0);
  }

  // Download model `id` ("" = the server's default) in `dtype` ("" = its default) and load it onto the
  // device, replacing the model loaded before (and starting a new chat). Resolves to the model's facts
  // (state.model); on failure the page shows the error and state.model is null.
  async function loadModel(id, dtype, t0) {
    if (state.busy) throw new Error("generating: load a model when it is done");
    t0 = t0 === undefined ? performance.now() : t0;
    state.loads += 1;
    state.model = null;
    setBusy(true);
    clearError();
    clearRunError();
    newChat();
    setPhase("loading", "Loading the model…");
    const def = state.manifest.default;
    try {
      const m = entry(id || def.model);
      if (!m) throw new Error(`no model ${JSON.stringify(id)} is served (${state.manifest.models.map((x) => x.id).join(", ")})`);
      dtype = dtype || (m.id === def.model ? def.dtype : m.dtypes[0]);
      if (!m.dtypes.includes(dtype)) throw new Error(`${m.name} loads in ${m.dtypes.join(", ")}, not ${dtype}`);
      $("model").value = m.id;
      fillDtypes(m);
      $("dtype").value = dtype;
      const dir = `${MODEL_DIR}/${m.id}/${dtype}`;
      let done = 0;
      for (const f of m.files[dtype]) {
        setPhase("loading", `Downloading ${f.name}${f.size === null ? "" : ` (${fmtBytes(f.size)})`}…`);
        const bytes = await fetchBytes(`model/${encodeURIComponent(m.id)}/${f.name.split("/").map(encodeURIComponent).join("/")}`);
        const path = `${dir}/${f.name}`;
        state.pyodide.FS.mkdirTree(path.slice(0, path.lastIndexOf("/")));
        state.pyodide.FS.writeFile(path, bytes);
        done += bytes.length;
      }
      const onProgress = (name, doneBytes, total) => {
        $("status").textContent = `Uploading weights to the GPU… ${Math.round(100 * doneBytes / total)}%`;
      };
      const facts = JSON.parse(await state.app.load_model.callPromising(dir, onProgress, dtype));
      Object.assign(facts, { id: m.id, name: m.name, format: m.format, download_bytes: done,
                             files: m.files[dtype].map((f) => f.name),
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
    $("weights").textContent = `${what}: downloaded ${fmtBytes(m.download_bytes)}${vs}; ` +
      `${fmtBytes(m.weight_bytes)} on the GPU`;
    $("weights").title = `files: ${m.files.join(", ")}` + (m.dtype === "float32" ? "" : "; norms and biases stay float32");
    if (!state.modeChosen) setMode(m.chat_template ? "chat" : "complete");
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

  // The form's fields go to Python as typed: app.check_request / check_chat parse and check them as
  // the CLI does (validate.py), so the page refuses what `webtensor generate` refuses, with its message.
  const FIELDS = { maxNewTokens: "max-tokens", temperature: "temperature", topK: "top-k", topP: "top-p", seed: "seed" };

  function takeOptions(opts) {
    for (const [key, id] of Object.entries(FIELDS)) {
      if (opts[key] !== undefined) $(id).value = opts[key] === null ? "" : String(opts[key]);
    }
  }

  // One run (a completion or a chat turn): `call(onPiece)` runs Python; `into` receives the streamed
  // text. Resolves to the run's JSON result; on failure shows the error and rethrows.
  async function run(call, into, onFail) {
    if (!["ready", "done", "failed"].includes(state.phase)) throw new Error(`not ready (phase ${state.phase})`);
    if (state.busy) throw new Error("already generating");
    setBusy(true);
    state.runs += 1;
    state.lastResult = null;
    clearRunError();
    $("speed").textContent = "–";  // no figures from a previous run stay on screen
    setPhase("generating", "Generating…");
    const onPiece = (piece, nTokens, tps) => {
      into().append(piece);
      $("speed").textContent = nTokens > 1 ? `${tps.toFixed(1)} tokens/s (${nTokens} tokens)` : `${nTokens} token`;
    };
    try {
      const res = JSON.parse(await call(onPiece));
      into();
      state.lastResult = res;
      const cut = res.truncated_tokens ? `; prompt truncated to its last ${res.prompt_tokens} tokens` : "";
      const seed = res.seed === null ? "" : `; seed ${res.seed}`;
      $("speed").textContent = `${res.tokens_per_s.toFixed(1)} tokens/s decode (${res.new_tokens} tokens; ` +
        `prompt of ${res.prompt_tokens} + first token ${(res.prefill_s * 1000).toFixed(0)} ms${seed}${cut})`;
      setPhase("done", `Done: ${res.new_tokens} tokens (${res.ended === "length" ? "the token limit" : res.ended === "eos" ? "end of text" : "end of turn"}).`);
      return res;
    } catch (e) {
      const err = pyErrorParts(e);
      state.runError = err;
      onFail();
      $("speed").textContent = "–";
      $("gen-error").textContent = err.message;
      $("gen-error").dataset.type = err.type;
      $("gen-error").style.display = "block";
      setPhase("failed", `Generation failed (${err.type}).`);
      throw e;
    } finally {
      setBusy(false);
    }
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
    return run((onPiece) => state.app.generate.callPromising(
      prompt, field("max-tokens"), field("temperature"), field("seed"), onPiece, field("top-k"), field("top-p"),
      $("truncate").checked), into, () => { out.textContent = ""; });
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
  // model's reply; the conversation (state.messages) keeps both.
  async function send(opts) {
    opts = opts || {};
    if (opts.message !== undefined) $("message").value = opts.message;
    takeOptions(opts);
    setMode("chat");
    const text = $("message").value;
    const user = addTurn("user", text);
    let reply = null;
    const into = () => reply || (reply = addTurn("assistant", ""));
    const messages = state.messages.concat([{ role: "user", content: text }]);
    const res = await run((onPiece) => state.app.chat.callPromising(
      JSON.stringify(messages), field("max-tokens"), field("temperature"), field("seed"), onPiece, field("top-k"),
      field("top-p")), into, () => { user.remove(); if (reply) reply.remove(); });
    state.messages = messages.concat([{ role: "assistant", content: res.reply }]);
    $("message").value = "";
    return res;
  }

  function newChat() {
    state.messages = [];
    $("conversation").textContent = "";
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
  $("new-chat").addEventListener("click", () => { newChat(); clearRunError(); });
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

  window.webtensorApp = { state, ready, generate, send, newChat, parity, bench, runPython, loadModel };
})();
