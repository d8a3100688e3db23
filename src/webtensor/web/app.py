"""What the web page calls into (from JavaScript, through Pyodide): device set-up, model loading,
streamed completion and chat, and the self-tests and benchmarks the headless-Chromium tests drive.

Every entry point that may touch the GPU is `async` and JavaScript calls it with `callPromising`,
so that readbacks can block on the GPU through JSPI (see `browser_gpu`). Results cross back to
JavaScript as JSON strings (one conversion instead of walking proxies).

The form's fields arrive as typed and are checked with the API's rules (`validate`), but refused in the page's
words: each message names the field's label on screen (`FIELDS`). While a reply is on screen, generation reads
each token back as soon as it is chosen (the next step already queued on the device); a Stop asked for between
two tokens ends it there, the text so far kept. A model may run on webtensor's CPU device instead (numpy in Pyodide,
where the page's Pyodide has it: faster than a software adapter); that path never waits on a GPU, so it hands the
browser's event loop a turn after each token.
"""

from __future__ import annotations

import gc
import json
import math
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import validate
from ..chat import turn_stops
from ..device import Device
from ..errors import ContextLengthError, SamplingError
from ..runtime.runner import RING_STEPS
from ..sampling import SamplingParams, with_seed
from ..serve.textstream import TextStream
from . import DTYPES

# device: the page's WebGPU device; dtype: the page's name for the weights
_state: dict[str, Any] = {"device": None, "model": None, "dtype": None}
DEVICES = ("webgpu", "cpu")  # where the page runs a model: the browser's WebGPU, or webtensor's CPU device (numpy)
MAX_NEW_TOKENS = 1000  # what the tokens box takes at most (and the model's context less one position)


@dataclass(frozen=True)
class PageField:
    """A sampling field of the page: its label on screen, what it takes in the page's words, how its text is read,
    the API's check of the value (`validate`), and whether an empty box means None (off / random)."""

    label: str
    takes: str
    parse: Callable[[str], Any]
    check: Callable[[Any], Any]
    optional: bool = False


FIELDS = {  # by the API's name
    "max_new_tokens": PageField("tokens", "a whole number from 1 to {limit}", int, validate.check_max_new_tokens),
    "temperature": PageField("temperature", "a number >= 0 (0 = greedy)", float, validate.check_temperature),
    "top_k": PageField("top-k", "a whole number >= 0 (0 or blank = off)", int, validate.check_top_k, True),
    "top_p": PageField("top-p", "a number in (0, 1] (1 or blank = off)", float, validate.check_top_p, True),
    "seed": PageField("seed", "a whole number >= 0 (blank = random)", int, validate.check_seed, True),
}
EMPTY_MESSAGE = "Message is empty: type something to send"


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0  # prompt pass + first token
    decode_s: float = 0.0  # the tokens after the first
    seed: int | None = None  # the seed sampling used (drawn fresh when none was given); None when greedy
    token_ids: list[int] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: tokens after the first, per second (0 when there are none)."""
        n = self.new_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(prompt_tokens=self.prompt_tokens, new_tokens=self.new_tokens, prefill_s=self.prefill_s,
                    decode_s=self.decode_s, tokens_per_s=self.tokens_per_s, seed=self.seed,
                    token_ids=list(self.token_ids))


def timed(model: Any, ids: list[int], max_new_tokens: int, stats: GenerationStats,
          **kw: Any) -> Generator[int, None, None]:
    """`model.generate_ids`, timing the prompt pass and the decode steps into `stats`."""
    t0 = time.perf_counter()
    for tok in model.generate_ids(ids, max_new_tokens, **kw):
        now = time.perf_counter()
        if stats.new_tokens == 0:
            stats.prefill_s = now - t0
        else:
            stats.decode_s = now - t0 - stats.prefill_s
        stats.new_tokens += 1
        stats.token_ids.append(tok)
        yield tok


def _let_page_run() -> None:
    """Gives the browser's event loop a turn (it shows the text so far and handles a Stop's click): a model on the
    CPU device computes without ever waiting, unlike WebGPU's readbacks. Nothing outside Pyodide."""
    try:
        from pyodide.ffi import can_run_sync, run_sync
    except ImportError:
        return
    if can_run_sync():
        import js

        run_sync(js.webtensorYield())


def _opt(x: Any) -> Any:
    """None for JavaScript's null / undefined (null arrives as pyodide's `jsnull`)."""
    return None if x is None or type(x).__name__ == "JsNull" else x


def _device() -> Device:
    dev: Device | None = _state["device"]
    if dev is None:
        raise RuntimeError("call init() first")
    return dev


async def init(max_binding_bytes: int | None = None) -> str:
    """Create the WebGPU device; JSON {adapter, backend, vendor, binding_bytes, features, fallback (the browser
    calls the adapter a software fallback: `isFallbackAdapter`), software (it runs on the CPU: a fallback, or a
    software driver by name)}. Raises NoAdapterError (with the browser's reason) when there is no WebGPU or no
    adapter."""
    dev = await Device.wgpu_async(max_binding_bytes)
    _state["device"] = dev
    info = dev.ctx.info
    return json.dumps(dict(adapter=info.name, backend=info.backend, vendor=info.vendor,
                           binding_bytes=dev.max_binding_bytes(), features=sorted(dev.ctx.api.features),
                           fallback=bool(getattr(dev.ctx.api, "fallback", False)), software=info.adapter_type == "CPU"))


async def load_model(model_path: str, on_progress: Any = None, dtype: Any = None, device: Any = None) -> str:
    """Load the model at `model_path` (Pyodide's file system: a checkpoint folder, a .gguf file, or a folder holding
    one) with webtensor's one loader (its pure-Python readers) onto `device` (`DEVICES`; None: WebGPU; "cpu" needs
    numpy, which the page loads first where its Pyodide has it): a float checkpoint in `dtype` (`DTYPES`; None:
    float32), a GGUF file as stored (its quantized blocks uploaded as they are; `dtype` is its stored type, only
    reported). A model loaded before is dropped first. JSON of the model's facts."""
    from ..formats.gguf_reader import find_gguf
    from ..models import load_model as load

    t0 = time.perf_counter()

    def progress(name: str, done: int, total: int) -> None:
        if on_progress is not None:
            on_progress(name, done, total)

    _state["model"] = _state["dtype"] = None  # its buffers go back to the device's pool before the new weights arrive
    gc.collect()
    dtype, device = _opt(dtype), _opt(device) or "webgpu"
    if device not in DEVICES:
        raise ValueError(f"the page runs a model on {' or '.join(DEVICES)}, not {device!r}")
    as_stored = find_gguf(model_path) is not None
    if not as_stored and (dtype or "float32") not in DTYPES:
        raise ValueError(f"the page loads a float checkpoint in {', '.join(DTYPES)}, not {dtype!r}")
    dev = _device() if device == "webgpu" else Device.cpu()
    model = load(model_path, dev, None if as_stored else dtype or "float32", progress=progress, reader="pure")
    _state["model"], _state["dtype"] = model, (dtype or "as stored") if as_stored else dtype or "float32"
    s = model.spec
    n_params = sum(math.prod(t.shape) for t in model.family.tensors(model.config).values())
    return json.dumps(dict(architecture=s.architecture, n_layer=s.n_layer, n_embd=s.width, n_head=s.n_head,
                           n_kv_head=s.n_kv_head, vocab_size=s.vocab_size, n_positions=model.n_ctx, n_params=n_params,
                           tokenizer=model.tokenizer.kind, dtype=_state["dtype"],
                           chat_template=model.chat_template is not None, weight_bytes=model.weight_bytes,
                           max_new_tokens=max_new_tokens_limit(model), device=device, load_s=time.perf_counter() - t0))


def _model() -> Any:
    model = _state["model"]
    if model is None:
        raise RuntimeError("no model is loaded")
    return model


def max_new_tokens_limit(model: Any) -> int:
    """The most tokens the page's box takes for `model`: MAX_NEW_TOKENS, within its context."""
    return max(1, min(MAX_NEW_TOKENS, int(model.n_ctx) - 1))


def read_field(name: str, x: Any, limit: int | None = None) -> Any:
    """The value of field `name` (an API name, `FIELDS`) from the page: its text parsed and checked with the API's
    rule (numbers pass through to the check), at most `limit` where given. SamplingError naming the label on screen
    and what was typed; an empty box is None for the optional fields."""
    f = FIELDS[name]
    takes = f.takes.format(limit=limit)
    typed = x = _opt(x)
    if isinstance(x, str):
        if not x.strip():
            if f.optional:
                return None
            raise SamplingError(f"{f.label} is empty: enter {takes}")
        try:
            x = f.parse(x.strip())
        except ValueError:
            raise SamplingError(f"{f.label} must be {takes}, got {typed!r}") from None
    try:
        value = f.check(x)
    except SamplingError:
        raise SamplingError(f"{f.label} must be {takes}, got {typed!r}") from None
    if limit is not None and value > limit:
        raise SamplingError(f"{f.label} must be {takes}, got {typed!r}")
    return value


def _sampling_fields(model: Any, max_new_tokens: Any, temperature: Any, top_k: Any, top_p: Any,
                     seed: Any) -> tuple[int, float, int | None, float | None, int | None]:
    """The page's sampling fields read (`read_field`): (max_new_tokens, temperature, top_k, top_p, seed)."""
    return (read_field("max_new_tokens", max_new_tokens, max_new_tokens_limit(model)),
            read_field("temperature", temperature), read_field("top_k", top_k), read_field("top_p", top_p),
            read_field("seed", seed))


def check_request(model: Any, prompt: Any, max_new_tokens: Any, temperature: Any, top_k: Any = None,
                  top_p: Any = None, seed: Any = None, truncate_prompt: Any = False) -> dict[str, Any]:
    """The page's inputs checked with the API's rules (validate.py), in the page's words: the sampling fields
    (`read_field`), the prompt's text, its ids, and its fit in the context (refused, or its last tokens kept when
    "truncate prompt" is ticked). SamplingError / ContextLengthError on the first bad input; else the normalised
    request."""
    n_new, t, k, p, s = _sampling_fields(model, max_new_tokens, temperature, top_k, top_p, seed)
    text = validate.check_text(_opt(prompt))
    ids = validate.check_ids(model.encode(text), model.vocab_size)
    truncate = bool(_opt(truncate_prompt))
    if len(ids) + n_new > model.n_ctx and not truncate:
        raise ContextLengthError(
            f"prompt of {len(ids)} tokens + {n_new} new tokens = {len(ids) + n_new} exceeds the model's context of "
            f"{model.n_ctx} positions; shorten the prompt, lower tokens, or tick \"truncate prompt\" to keep the "
            "prompt's last tokens")
    run_ids = validate.fit_context(ids, n_new, model.n_ctx, truncate)
    return dict(ids=ids, run_ids=run_ids, max_new_tokens=n_new, temperature=t, top_k=k, top_p=p, seed=s)


def _stream(model: Any, ids: list[int], n_new: int, params: SamplingParams, on_piece: Any,
            stops: Sequence[str] = (), stop_requested: Any = None, watched: Any = True,
            **kw: Any) -> tuple[str, str, GenerationStats]:
    """Generate after `ids`, calling `on_piece(text, n_new_tokens, tokens_per_s)` as text forms (special tokens
    never shown; text that may begin a stop string held back until it is known not to). `stop_requested()` (the
    page's Stop) is asked after each token: true ends generation there. `watched`: someone reads the reply as it
    forms, so each token is read back as soon as it is chosen (else readbacks bring up to RING_STEPS tokens).
    (the text, why it ended: "eos", "stop", "length" or "stopped", the stats)."""
    st = GenerationStats(prompt_tokens=len(ids), seed=params.seed)
    gen = timed(model, ids, n_new, st, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                seed=params.seed, follow_steps=1 if _opt(watched) in (None, True) else RING_STEPS, **kw)
    text = TextStream(stops)
    pieces = []
    stopped = False
    on_cpu = getattr(getattr(model, "device", None), "kind", None) == "cpu"
    try:
        for tok in gen:
            pieces.append(text.push(model.tokenizer.token_bytes(tok)))
            if pieces[-1] and on_piece is not None:
                on_piece(pieces[-1], st.new_tokens, st.tokens_per_s)
            if on_cpu:
                _let_page_run()
            if text.stopped:
                break
            if stop_requested is not None and st.new_tokens < n_new and stop_requested():
                stopped = True
                break
    finally:
        gen.close()  # (a stop string or Stop: the tokens after it are not generated)
    pieces.append(text.finish())
    if pieces[-1] and on_piece is not None:
        on_piece(pieces[-1], st.new_tokens, st.tokens_per_s)
    ends = model.eos_ids | frozenset(kw.get("stop_token_ids", ()))
    eos = st.token_ids and st.token_ids[-1] in ends
    ended = "stop" if text.stopped else "eos" if eos else "stopped" if stopped else "length"
    return "".join(pieces), ended, st


def _reply(st: GenerationStats, params: SamplingParams, **fields: Any) -> str:
    dev = _state["model"].device if _state["model"] is not None else _device()
    where = "CPU (numpy)" if dev.kind == "cpu" else dev.ctx.info.name
    return json.dumps(dict(adapter=where, stats=dev.stats(), dtype=_state["dtype"],
                           temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                           **fields, **st.as_dict()))


async def generate(prompt: str, max_new_tokens: Any = 50, temperature: Any = 0.0, seed: Any = None,
                   on_piece: Any = None, top_k: Any = None, top_p: Any = None, truncate_prompt: Any = False,
                   stop_requested: Any = None, watched: Any = True) -> str:
    """Complete `prompt`, calling `on_piece(text, n_new_tokens, tokens_per_s)` as text forms and ending early when
    `stop_requested()` says so (see `_stream`); JSON of the prompt ids, new ids, text, why it ended, the seed used
    and timings. The parameters may be the form fields' text; they are checked as the API checks them, refused in
    the page's words (`check_request`)."""
    model = _model()
    req = check_request(model, prompt, max_new_tokens, temperature, top_k, top_p, seed, truncate_prompt)
    params = with_seed(SamplingParams(req["temperature"], req["top_k"], req["top_p"], req["seed"]))
    text, ended, st = _stream(model, req["run_ids"], req["max_new_tokens"], params, on_piece,
                              stop_requested=stop_requested, watched=watched)
    return _reply(st, params, prompt_ids=req["ids"], truncated_tokens=len(req["ids"]) - len(req["run_ids"]),
                  text=text, ended=ended)


def check_chat(model: Any, messages: Any, max_new_tokens: Any, temperature: Any, top_k: Any = None,
               top_p: Any = None, seed: Any = None) -> dict[str, Any]:
    """A chat turn's inputs checked: the sampling fields as `check_request` checks them, each message's text (the
    last one not blank), the conversation rendered with the model's chat template (its ids), and its fit: the reply
    gets at most `max_new_tokens` and at least one position of the context (ContextLengthError when none is
    left)."""
    n_new, t, k, p, s = _sampling_fields(model, max_new_tokens, temperature, top_k, top_p, seed)
    if not isinstance(messages, list) or not messages:
        raise SamplingError("a chat needs a list of messages ({role, content})")
    for m in messages:
        validate.check_text(m.get("content") if isinstance(m, dict) else m)
    last = messages[-1].get("content") if isinstance(messages[-1], dict) else messages[-1]
    if isinstance(last, str) and not last.strip():
        raise SamplingError(EMPTY_MESSAGE)
    prompt = model.apply_chat_template(messages, add_generation_prompt=True)
    ids = validate.check_ids(model.tokenizer.encode(prompt, add_special_tokens=False), model.vocab_size)
    room = model.n_ctx - len(ids)
    if room < 1:
        raise ContextLengthError(f"the conversation is {len(ids)} tokens, the model's context {model.n_ctx} "
                                 "positions: press New chat")
    return dict(prompt=prompt, ids=ids, max_new_tokens=min(n_new, room), temperature=t, top_k=k, top_p=p, seed=s)


async def chat(messages_json: str, max_new_tokens: Any = 256, temperature: Any = 0.0, seed: Any = None,
               on_piece: Any = None, top_k: Any = None, top_p: Any = None, stop_requested: Any = None,
               watched: Any = True) -> str:
    """The assistant's next turn in the conversation `messages_json` (a JSON list of {role, content}), rendered
    with the model's chat template (the plain one for a model without), ending where `chat.turn_stops` says the turn
    ends, streamed to `on_piece` and stopped by `stop_requested` as `generate` does. The conversation's earlier turns
    still in the KV cache are not computed again. JSON: `reply` (the text, stripped: the next turn's assistant
    message), the rendered `prompt`, its ids, the new ids, why it ended, the seed and timings."""
    model = _model()
    req = check_chat(model, json.loads(messages_json), max_new_tokens, temperature, top_k, top_p, seed)
    params = with_seed(SamplingParams(req["temperature"], req["top_k"], req["top_p"], req["seed"]))
    stops = turn_stops(model)
    text, ended, st = _stream(model, req["ids"], req["max_new_tokens"], params, on_piece, stops.strings,
                              stop_requested, watched, reuse_prefix=True, stop_token_ids=stops.token_ids)
    return _reply(st, params, prompt=req["prompt"], prompt_ids=req["ids"], text=text, reply=text.strip(),
                  ended=ended)


async def run_parity(cases_json: str) -> str:
    """Run op cases on the browser device (see `selftest.run_cases`); JSON results."""
    from . import selftest

    return json.dumps(selftest.run_cases(_device(), json.loads(cases_json)))


async def bench(options_json: str = "{}") -> str:
    """Per-dispatch cost and (if a model is loaded) decode tokens/s of greedy decoding (options: dispatch: {...},
    gen: {prompt, max_new_tokens, follow_steps}); JSON."""
    from . import selftest

    opts = json.loads(options_json)
    out = selftest.bench_dispatch(_device(), **opts.get("dispatch", {}))
    model = _state["model"]
    if model is not None and opts.get("generate", True):
        g = opts.get("gen", {})
        ids = model.encode(g.get("prompt", "It is a truth universally acknowledged"))
        n = min(int(g.get("max_new_tokens", 32)), model.n_ctx - len(ids))
        follow = int(g.get("follow_steps", RING_STEPS))  # 1: the page's streaming; RING_STEPS: fewest readbacks
        model.generate(ids, 3, stop_at_eos=False, follow_steps=follow)  # warm-up: every pipeline compiled
        st = GenerationStats(prompt_tokens=len(ids))
        list(timed(model, ids, n, st, stop_at_eos=False, follow_steps=follow))
        out["generate"] = st.as_dict() | dict(follow_steps=follow)
        out["generate"].pop("token_ids")
    return json.dumps(out)
