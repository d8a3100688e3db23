"""`webtensor serve` and `webtensor bench-serve`: arguments, checked before any model loads (a bad
one is a single line on stderr and exit status 2), then the server or the load generator.

`serve` binds its address before it loads the model: a port in use (or an address it cannot have)
is one line on stderr and exit status 1, as is a checkpoint that cannot be loaded (runtime errors,
as the README's table of exit codes has them)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .. import cmdline
from ..errors import WebtensorError

MAX_BODY = 8 * 1024 * 1024  # (app.MAX_BODY: not imported here, so --help loads no server code)
KEEP_ALIVE, IDLE_TIMEOUT = 5.0, 30.0  # (server.KEEP_ALIVE, server.IDLE_TIMEOUT)
BODY_TIMEOUT = 60.0  # (app.BODY_DEADLINE)

ENGINES = ("batched", "reference")


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (continuous batching on one device)")
    p.add_argument("--model", "-m", default=None,
                   help="a checkpoint directory, a .gguf file, or a Hugging Face id in the local cache (default: the "
                        "shipped model)")
    p.add_argument("--device", "-d", default="auto", type=cmdline.device_name,
                   help="auto (default), cpu, wgpu, wgpu:N (adapter N of `webtensor devices`), lavapipe")
    p.add_argument("--dtype", default="auto", choices=cmdline.DTYPE_CHOICES,
                   help="auto (default: as stored; quantized GGUF tensors stay quantized), float32, float16 or "
                        "q8_0 / int8")
    p.add_argument("--ctx-size", "-c", type=int, default=None,
                   help="positions per sequence slot (default: the model's context, at most 4096)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=int, default=32,
                   help="sequences decoded together (the KV cache's memory is --kv-memory's)")
    p.add_argument("--engine", default="batched",
                   help="batched (default: a step's decode rows as one forward) or reference (row by row)")
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting for a slot before 429")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--prefill-chunk", type=int, default=None,
                   help="prompt tokens a request reads a step, one replayed graph (default: the device's policy, "
                        "512 on GPUs, 128 on CPU adapters and the CPU device)")
    p.add_argument("--prefill-budget", type=int, default=None,
                   help="prompt tokens read per step over all arriving requests while others decode (at least one "
                        "chunk; nothing decoding: every arriving request's next chunk). Default: the device's "
                        "policy, 512 on GPUs, 128 on CPU adapters and the CPU device")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds running streams get to finish on SIGTERM (then each ends with an error event)")
    p.add_argument("--max-body", type=int, default=MAX_BODY,
                   help=f"largest request body in bytes (default {MAX_BODY // 2**20} MiB; larger: 413)")
    p.add_argument("--cors-origins", default=None,
                   help="comma-separated origins browsers may call the API from ('*': any); default none")
    p.add_argument("--keep-alive", type=float, default=KEEP_ALIVE,
                   help=f"seconds an idle keep-alive connection stays open (default {KEEP_ALIVE:g})")
    p.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT,
                   help="seconds a connection may take to send a request's headers, or a stalled body its next "
                        f"bytes (default {IDLE_TIMEOUT:g})")
    p.add_argument("--body-timeout", type=float, default=BODY_TIMEOUT,
                   help=f"seconds a request's whole body may take to arrive, however it trickles (default "
                        f"{BODY_TIMEOUT:g}; then 408)")
    p.add_argument("--engine-process", default="auto", choices=("auto", "on", "off"),
                   help="run the engine in its own process, off the HTTP event loop's GIL (auto: on for --device cpu, "
                        "whose steps are mostly Python)")
    cmdline.add_blas_threads(p)
    cmdline.add_chat_template(p)
    p.add_argument("--no-prefix-reuse", dest="prefix_reuse", action="store_false",
                   help="compute every prompt whole (default: prompts share the KV blocks of their common start: "
                        "the prefix cache)")
    p.add_argument("--kv-dtype", default="auto", choices=("auto", "float32", "float16", "q8_0"),
                   help="the KV cache's type (auto: float16 on GPUs with shader-f16, else float32; q8_0: llama.cpp's "
                        "8-bit blocks, half of float16)")
    p.add_argument("--kv-memory", default=None, type=cmdline.checked(_kv_memory, str),
                   help="the KV cache's pool: bytes (8GiB, 512MiB) or a share of the device's memory (0.5); default: "
                        "--max-batch whole contexts, cut to what fits beside the weights")
    p.set_defaults(func=run_serve)

    b = sub.add_parser("bench-serve", help="load-test a running server: tokens/s, TTFT, inter-token latency")
    b.add_argument("--url", default="http://127.0.0.1:8000",
                   help="the server (default http://127.0.0.1:8000); several, comma-separated, are measured in turn")
    b.add_argument("--concurrency", default="1,8,32,64", help="comma-separated levels (default 1,8,32,64)")
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--rounds", type=int, default=1, help="requests per client at each level (default 1)")
    b.add_argument("--model", "-m", default=None, help="the server's checkpoint, for --hf (default: shipped)")
    b.add_argument("--api-key", default=None)
    b.add_argument("--json", default=None, help="write the figures to this JSON file")
    b.add_argument("--plot", default=None, help="draw tokens/s and latency per level to this image file")
    b.add_argument("--shared-prefix", type=int, default=0, metavar="N",
                   help="start every prompt with the same text of N tokens (prefix reuse shows in TTFT)")
    b.add_argument("--prompt-tokens", type=int, default=0, metavar="N",
                   help="prompts of exactly N tokens, each its own (streams of N + --max-tokens positions of KV cache)")
    b.add_argument("--hf", action="store_true", help="also time HF transformers' batched generate, same prompts")
    b.add_argument("--hf-only", action="store_true", help="time only HF's batched generate (no server needed)")
    b.add_argument("--hf-device", default="cpu", help="torch device for --hf / --hf-only (default cpu; e.g. cuda)")
    b.add_argument("--hf-dtype", default="float32", help="torch dtype for --hf / --hf-only (default float32)")
    b.add_argument("--hf-threads", type=int, default=0, help="torch CPU threads for HF (default 0: torch's own)")
    b.set_defaults(func=run_bench)


def _kv_memory(text: str) -> str:
    """--kv-memory checked while parsing (bytes or a share; `runtime.cache.parse_kv_memory`), kept as given."""
    from ..runtime.cache import parse_kv_memory

    parse_kv_memory(text)
    return text


def _fail(msg: str, status: int = 2) -> int:
    print(f"webtensor: error: {msg}", file=sys.stderr)
    return status


def _origins(value: str | None) -> list[str]:
    return [o.strip() for o in (value or "").split(",") if o.strip()]


def _check_serve(a: argparse.Namespace) -> str | None:
    if a.ctx_size is not None and a.ctx_size < 2:
        return f"--ctx-size must be >= 2, got {a.ctx_size}"
    if not 0 <= a.port <= 65535:
        return f"--port must be in 0..65535, got {a.port}"
    if a.engine not in ENGINES:
        return f"--engine must be one of {', '.join(ENGINES)}, got {a.engine!r}"
    if a.max_batch < 1:
        return f"--max-batch must be >= 1, got {a.max_batch}"
    if a.max_queue < 0:
        return f"--max-queue must be >= 0, got {a.max_queue}"
    if a.grace < 0:
        return f"--grace must be >= 0, got {a.grace}"
    if a.max_body < 1:
        return f"--max-body must be >= 1 (bytes), got {a.max_body}"
    if a.keep_alive < 0:
        return f"--keep-alive must be >= 0, got {a.keep_alive}"
    if a.idle_timeout <= 0:
        return f"--idle-timeout must be > 0, got {a.idle_timeout}"
    if a.body_timeout <= 0:
        return f"--body-timeout must be > 0, got {a.body_timeout}"
    if a.cors_origins is not None:
        bad = [o for o in _origins(a.cors_origins) if o != "*" and not o.startswith(("http://", "https://"))]
        if bad or not _origins(a.cors_origins):
            return f"--cors-origins must be '*' or comma-separated http(s):// origins, got {a.cors_origins!r}"
    if a.prefill_budget is not None and a.prefill_budget < 1:
        return f"--prefill-budget must be >= 1, got {a.prefill_budget}"
    if a.prefill_chunk is not None and a.prefill_chunk < 1:
        return f"--prefill-chunk must be >= 1, got {a.prefill_chunk}"
    if not a.host:
        return "--host must not be empty"
    if a.api_key is not None and not a.api_key:
        return "--api-key must not be empty"
    return None


def run_serve(a: argparse.Namespace) -> int:
    if (msg := _check_serve(a)) is not None:
        return _fail(msg)
    template = {} if a.chat_template is None else {"chat_template": cmdline.chat_template_file(a.chat_template)}
    from .server import bind, serve

    try:  # before the model loads: a port in use is one line, at once
        sock = bind(a.host, a.port)
    except OSError as e:
        return _fail(f"cannot listen on {a.host}:{a.port}: {e.strerror or e}", 1)
    cmdline.use_blas_threads(a.blas_threads)
    from .process import ProcessEngine, build_engine

    name = "webtensor-shipped" if a.model is None else Path(a.model).name or str(a.model)
    spec = dict(model=a.model, device=a.device, dtype=None if a.dtype == "auto" else a.dtype, n_ctx=a.ctx_size,
                max_batch=a.max_batch, engine=a.engine, name=name, blas_threads=a.blas_threads,
                prefix_reuse=a.prefix_reuse, prefill_chunk=a.prefill_chunk, prefill_budget=a.prefill_budget,
                kv_dtype=None if a.kv_dtype == "auto" else a.kv_dtype, kv_memory=a.kv_memory, **template)
    in_process = a.engine_process == "on" or (a.engine_process == "auto" and a.device.lower() == "cpu")
    try:
        if in_process:
            engine: Any = ProcessEngine(spec)
            where = f"{engine.device}, engine in its own process"
        else:
            engine = build_engine(spec)
            where = engine.model.device.describe()
    except WebtensorError:  # one line, exit status by its kind (a checkpoint's: 1), from cmdline.run_main
        sock.close()
        raise
    from .app import template_problem

    if (problem := template_problem(engine)) is not None:
        print(f"webtensor: warning: the model's chat template cannot render conversations: {problem}. "
              "/v1/chat/completions, /v1/responses and /tokenize with messages answer 400 with this error; "
              "/v1/completions works", file=sys.stderr)
    host, port = sock.getsockname()[:2]
    url_host = f"[{host}]" if ":" in host else host
    print(f"[webtensor] serving {engine.name} ({a.dtype}) on {where} at http://{url_host}:{port} "
          f"({a.engine} engine, max batch {a.max_batch}, queue {a.max_queue}, prompts in chunks of "
          f"{engine.prefill_chunk}, {engine.prefill_budget} prompt tokens a step beside decoding); {engine.memory}",
          file=sys.stderr)
    try:
        serve(engine, a.host, a.port, a.max_queue, a.api_key, a.grace, sock=sock,
              max_body=a.max_body, cors_origins=_origins(a.cors_origins), keep_alive=a.keep_alive,
              idle_timeout=a.idle_timeout, body_timeout=a.body_timeout)
    finally:
        if in_process:
            engine.close()
    return 0


def run_bench(a: argparse.Namespace) -> int:
    try:
        levels = [int(c) for c in a.concurrency.split(",") if c.strip()]
    except ValueError:
        return _fail(f"--concurrency must be comma-separated integers, got {a.concurrency!r}")
    if not levels or min(levels) < 1:
        return _fail(f"--concurrency levels must be >= 1, got {a.concurrency!r}")
    urls = [u.strip() for u in a.url.split(",") if u.strip()]
    if not urls or not all(u.startswith("http://") for u in urls):
        return _fail(f"--url must start with http:// (each of a comma-separated list), got {a.url!r}")
    if a.max_tokens < 1 or a.rounds < 1:
        return _fail("--max-tokens and --rounds must be >= 1")
    if a.shared_prefix < 0:
        return _fail(f"--shared-prefix must be >= 0, got {a.shared_prefix}")
    if a.prompt_tokens < 0 or (a.prompt_tokens and (a.hf or a.hf_only)):
        return _fail(f"--prompt-tokens must be >= 0 (and is not for --hf), got {a.prompt_tokens}")
    if a.hf_threads < 0:
        return _fail(f"--hf-threads must be >= 0, got {a.hf_threads}")
    if a.hf_dtype not in ("float32", "float16", "bfloat16"):
        return _fail(f"--hf-dtype must be float32, float16 or bfloat16, got {a.hf_dtype!r}")
    from . import bench

    try:
        return bench.main(a.url, levels, a.max_tokens, a.rounds, a.model, a.api_key, a.json, a.plot, a.hf,
                          a.hf_only, a.hf_device, a.hf_dtype, a.hf_threads, a.shared_prefix, a.prompt_tokens)
    except WebtensorError as e:
        return _fail(str(e))
