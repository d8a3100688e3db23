"""What the web page calls into (from JavaScript, through Pyodide): device set-up, model loading,
streamed generation, and the self-tests and benchmarks the headless-Chromium tests drive.

Every entry point that may touch the GPU is `async` and JavaScript calls it with `callPromising`,
so that readbacks can block on the GPU through JSPI (see `browser_gpu`). Results cross back to
JavaScript as JSON strings (one conversion instead of walking proxies).
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..device import Device
from .gpt2_web import WebGPT2

_state: dict[str, Any] = {"device": None, "model": None}


def _opt(x: Any) -> Any:
    """None for JavaScript's null / undefined (null arrives as pyodide's `jsnull`)."""
    return None if x is None or type(x).__name__ == "JsNull" else x


def _device() -> Device:
    dev = _state["device"]
    if dev is None:
        raise RuntimeError("call init() first")
    return dev


async def init(max_binding_bytes: int | None = None) -> str:
    """Create the WebGPU device; JSON {adapter, backend, limits, features}. Raises NoAdapterError
    (with the browser's reason) when there is no WebGPU or no adapter."""
    dev = await Device.wgpu_async(max_binding_bytes)
    _state["device"] = dev
    info = dev.ctx.info
    return json.dumps(dict(adapter=info.name, backend=info.backend, vendor=info.vendor,
                           binding_bytes=dev.max_binding_bytes(), features=sorted(dev.ctx.api.features)))


async def load_model(model_dir: str, on_progress: Any = None) -> str:
    """Load the GPT-2 checkpoint in `model_dir` (Pyodide's file system) onto the device."""
    t0 = time.perf_counter()

    def progress(name: str, done: int, total: int) -> None:
        if on_progress is not None:
            on_progress(name, done, total)

    model = WebGPT2.load(model_dir, _device(), progress)
    _state["model"] = model
    cfg = model.config
    n_params = sum(t.size for t in (model.wte, model.wpe, *model.ln_f)) + sum(
        t.size for b in model.blocks for t in b)
    return json.dumps(dict(n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head,
                           vocab_size=cfg.vocab_size, n_positions=cfg.n_positions, n_params=n_params,
                           tokenizer=model.tokenizer.kind, load_s=time.perf_counter() - t0))


async def generate(prompt: str, max_new_tokens: int = 50, temperature: float = 0.0, seed: int | None = None,
                   on_piece: Any = None, top_k: int | None = None) -> str:
    """Generate from `prompt`, calling `on_piece(text, n_new_tokens, tokens_per_s)` as text forms;
    JSON of the prompt ids, new ids, text and timings."""
    model: WebGPT2 | None = _state["model"]
    if model is None:
        raise RuntimeError("no model is loaded")
    seed, top_k = _opt(seed), _opt(top_k)
    ids = model.tokenizer.encode(prompt)
    n_ctx = model.config.n_positions
    max_new_tokens = max(0, min(int(max_new_tokens), n_ctx - len(ids)))
    pieces = []
    for piece in model.stream(prompt, max_new_tokens, temperature=float(temperature), top_k=top_k,
                              seed=None if seed is None else int(seed)):
        pieces.append(piece)
        if on_piece is not None:
            st = model.last_stats
            on_piece(piece, st.new_tokens, st.tokens_per_s)
    st = model.last_stats
    return json.dumps(dict(prompt_ids=ids, text="".join(pieces), adapter=_device().ctx.info.name,
                           stats=_device().stats(), **st.as_dict()))


async def run_parity(cases_json: str) -> str:
    """Run op cases on the browser device (see `selftest.run_cases`); JSON results."""
    from . import selftest

    return json.dumps(selftest.run_cases(_device(), json.loads(cases_json)))


async def bench(options_json: str = "{}") -> str:
    """Per-dispatch cost and (if a model is loaded) decode tokens/s; JSON."""
    from . import selftest

    opts = json.loads(options_json)
    out = selftest.bench_dispatch(_device(), **opts.get("dispatch", {}))
    model = _state["model"]
    if model is not None and opts.get("generate", True):
        g = opts.get("gen", {})
        ids = model.tokenizer.encode(g.get("prompt", "It is a truth universally acknowledged"))
        n = min(int(g.get("max_new_tokens", 32)), model.config.n_positions - len(ids))
        model.generate(ids, 2, stop_at_eos=False)  # warm-up: every pipeline compiled
        model.generate(ids, n, stop_at_eos=False)
        out["generate"] = model.last_stats.as_dict()
        out["generate"].pop("token_ids")
    return json.dumps(out)
