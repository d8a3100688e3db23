// The page's logic: load Pyodide and webtensor, create the WebGPU device, load the model, and
// stream generated text into the page. `window.webtensorApp` exposes the same steps to the
// headless-Chromium tests (generate, op parity, benchmarks, loadModel).
// The weights' dtype comes from the address (?dtype=float32 | float16 | int8), else the server's
// default (`webtensor web --dtype`); the dtype menu reloads the model in another. int8 downloads
// the server's q8_0 GGUF in place of model.safetensors.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const LIB_DIR = "/home/pyodide/lib";
  const MODEL_DIR = "/home/pyodide/model";
  const state = { phase: "starting", app: null, pyodide: null, busy: false, runs: 0, info: null, model: null,
                  lastResult: null, error: null, runError: null, loads: 0 };

  function setPhase(phase, text) {
    state.phase = phase;
    document.body.dataset.phase = phase;
    if (text !== undefined) $("status").textContent = text;
  }

  function showError(title, detail) {
    state.error = { title, detail: detail || "" };
    const box = $("error");
    box.textContent = title + (detail ? "\n" + detail : "");
    box.style.display = "block";
    setPhase("error", title);
    $("generate").disabled = true;
  }

  function clearError() {
    state.error = null;
    $("error").textContent = "";
    $("error").style.display = "none";
  }

  // A Python exception's message without its traceback ("Type: message" -> "message (Type)").
  function pyError(e) {
    const lines = String((e && e.message) || e).trim().split("\n").filter((l) => l.trim());
    const last = lines.length ? lines[lines.length - 1] : "unknown error";
    const m = last.match(/^([\w.]+(?:Error|Exception)): (.*)$/);
    return m ? `${m[2]} (${m[1].split(".").pop()})` : last;
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
    const app = pyodide.pyimport("webtensor.web.app");
    state.app = app;

    setPhase("loading", "Requesting a WebGPU adapter…");
    try {
      state.info = JSON.parse(await app.init.callPromising());
    } catch (e) {
      showError("No WebGPU in this browser.", pyError(e));
      return;
    }
    $("adapter").textContent = `${state.info.adapter} (${state.info.backend}; max binding ${fmtBytes(state.info.binding_bytes)})`;

    const f16 = state.info.features.includes("shader-f16");
    const f16Option = $("dtype").querySelector('option[value="float16"]');
    f16Option.disabled = !f16;
    if (!f16) f16Option.textContent = "float16 (no shader-f16)";
    $("dtype").addEventListener("change", () => { loadModel($("dtype").value).catch((e) => console.error(e)); });
    const asked = new URLSearchParams(location.search).get("dtype");
    await loadModel(asked || "", t0);
  }

  // Download the checkpoint for `dtype` ("" = the server's default) and load it onto the device,
  // replacing the model loaded before. Resolves to the model's facts (state.model); on failure the
  // page shows the error and state.model is null.
  async function loadModel(dtype, t0) {
    if (state.busy) throw new Error("generating: load a model when it is done");
    t0 = t0 === undefined ? performance.now() : t0;
    state.busy = true;
    state.loads += 1;
    state.model = null;
    $("generate").disabled = true;
    $("dtype").disabled = true;
    clearError();
    setPhase("loading", "Loading the model…");
    try {
      const query = dtype ? `?dtype=${encodeURIComponent(dtype)}` : "";
      const manifest = await (await fetchOk(`model/manifest.json${query}`)).json();
      $("dtype").value = manifest.dtype;
      const dir = manifest.dtype === "int8" ? `${MODEL_DIR}-int8` : MODEL_DIR;
      state.pyodide.FS.mkdirTree(dir);
      let done = 0;
      for (const f of manifest.files) {
        setPhase("loading", `Downloading ${f.name} (${fmtBytes(f.size)})…`);
        const bytes = await fetchBytes(`model/${encodeURIComponent(f.name)}`);
        state.pyodide.FS.writeFile(`${dir}/${f.name}`, bytes);
        done += bytes.length;
      }
      const onProgress = (name, doneBytes, total) => {
        $("status").textContent = `Uploading weights to the GPU… ${Math.round(100 * doneBytes / total)}%`;
      };
      const model = JSON.parse(await state.app.load_model.callPromising(dir, onProgress, manifest.dtype));
      model.name = manifest.name;
      model.download_bytes = done;
      model.float32_bytes = manifest.float32_bytes;
      model.files = manifest.files.map((f) => f.name);
      state.model = model;
    } catch (e) {
      $("weights").textContent = "–";
      showError("Model failed to load.", pyError(e));
      return null;
    } finally {
      state.busy = false;
      $("dtype").disabled = false;
    }
    const m = state.model;
    $("model").textContent = `${m.name}: ${m.n_layer} layers, ${m.n_embd} wide, ${(m.n_params / 1e6).toFixed(2)} M ` +
      `parameters, vocabulary ${m.vocab_size} (tokenizer: ${m.tokenizer})`;
    const what = m.dtype === "int8" ? "int8 (q8_0 matrices)" : m.dtype === "float16" ? "float16 (matrices)" : "float32";
    const vs = m.dtype === "int8" ? `, ${(m.download_bytes / m.float32_bytes).toFixed(2)}x float32's ` +
      `${fmtBytes(m.float32_bytes)}` : "";
    $("weights").textContent = `${what}: downloaded ${fmtBytes(m.download_bytes)}${vs}; ` +
      `${fmtBytes(m.weight_bytes)} on the GPU`;
    $("weights").title = `files: ${m.files.join(", ")}` +
      (m.dtype === "float32" ? "" : "; layer norms, biases and positions stay float32");
    $("generate").disabled = false;
    setPhase("ready", `Ready in ${((performance.now() - t0) / 1000).toFixed(1)} s. Type a prompt and press Generate.`);
    return m;
  }

  // A Python exception as {type, message}: its last line "pkg.Type: message", without the traceback.
  function pyErrorParts(e) {
    const lines = String((e && e.message) || e).trim().split("\n").filter((l) => l.trim());
    const last = lines.length ? lines[lines.length - 1] : "unknown error";
    const m = last.match(/^([\w.]+(?:Error|Exception)): (.*)$/);
    return m ? { type: m[1].split(".").pop(), message: m[2] } : { type: "Error", message: last };
  }

  function clearRunError() {
    state.runError = null;
    $("gen-error").textContent = "";
    $("gen-error").style.display = "none";
  }

  // The form's fields go to Python as typed: app.check_request parses and checks them as the CLI
  // does (validate.py), so the page refuses what `webtensor generate` refuses, with its message.
  const FIELDS = { maxNewTokens: "max-tokens", temperature: "temperature", topK: "top-k", topP: "top-p", seed: "seed" };

  async function generate(opts) {
    opts = opts || {};
    if (!["ready", "done", "failed"].includes(state.phase)) throw new Error(`not ready (phase ${state.phase})`);
    if (state.busy) throw new Error("already generating");
    if (opts.prompt !== undefined) $("prompt").value = opts.prompt;
    for (const [key, id] of Object.entries(FIELDS)) {
      if (opts[key] !== undefined) $(id).value = opts[key] === null ? "" : String(opts[key]);
    }
    if (opts.truncate !== undefined) $("truncate").checked = !!opts.truncate;
    const prompt = $("prompt").value;
    const field = (id) => $(id).value;
    state.busy = true;
    state.runs += 1;
    state.lastResult = null;
    clearRunError();
    $("generate").disabled = true;
    $("speed").textContent = "–";  // no figures from a previous run stay on screen
    const out = $("output");
    out.textContent = "";
    const p = document.createElement("span");
    p.className = "prompt";
    p.textContent = prompt;
    const gen = document.createElement("span");
    gen.className = "generated";
    let started = false;
    setPhase("generating", "Generating…");
    const onPiece = (piece, nTokens, tps) => {
      if (!started) { out.append(p, gen); started = true; }  // the inputs passed their checks
      gen.append(piece);
      $("speed").textContent = nTokens > 1 ? `${tps.toFixed(1)} tokens/s (${nTokens} tokens)` : `${nTokens} token`;
    };
    try {
      const res = JSON.parse(await state.app.generate.callPromising(
        prompt, field("max-tokens"), field("temperature"), field("seed"), onPiece, field("top-k"), field("top-p"),
        $("truncate").checked));
      if (!started) out.append(p, gen);
      state.lastResult = res;
      const cut = res.truncated_tokens ? `; prompt truncated to its last ${res.prompt_tokens} tokens` : "";
      const seed = res.seed === null ? "" : `; seed ${res.seed}`;
      $("speed").textContent = `${res.tokens_per_s.toFixed(1)} tokens/s decode (${res.new_tokens} tokens; ` +
        `prompt of ${res.prompt_tokens} + first token ${(res.prefill_s * 1000).toFixed(0)} ms${seed}${cut})`;
      setPhase("done", `Done: ${res.new_tokens} tokens.`);
      return res;
    } catch (e) {
      const err = pyErrorParts(e);
      state.runError = err;
      out.textContent = "";
      $("speed").textContent = "–";
      $("gen-error").textContent = err.message;
      $("gen-error").dataset.type = err.type;
      $("gen-error").style.display = "block";
      setPhase("failed", `Generation failed (${err.type}).`);
      throw e;
    } finally {
      state.busy = false;
      $("generate").disabled = false;
    }
  }

  async function parity(casesJson) {
    return JSON.parse(await state.app.run_parity.callPromising(casesJson));
  }

  async function bench(optionsJson) {
    return JSON.parse(await state.app.bench.callPromising(optionsJson || "{}"));
  }

  $("generate").addEventListener("click", () => { generate().catch((e) => console.error(e)); });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) $("generate").click();
  });

  const ready = boot().catch((e) => showError("webtensor failed to start.", String((e && e.message) || e)));
  // Runs Python in the page's interpreter (async, so GPU readbacks work): for tests and debugging.
  async function runPython(code) {
    return state.pyodide.runPythonAsync(code);
  }

  window.webtensorApp = { state, ready, generate, parity, bench, runPython, loadModel };
})();
