"""`webtensor generate` (stream a continuation of a prompt to stdout) and `webtensor chat` (an interactive, streamed
conversation in the terminal), for any model `load_model` reads: `--model` is a checkpoint directory, a .gguf
file or an id in the local Hugging Face cache (default: the small model shipped with webtensor).

`check_generate` / `check_chat` check everything a run needs (the prompt's text and length against the context,
the sampling parameters, the device and its dtype support, the checkpoint's config and tokenizer) before the
weights load or anything is printed; which model and device went to stderr, the text to stdout."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from . import cmdline, validate
from .errors import UsageError, WebtensorError


def _model_args(p: argparse.ArgumentParser, default_temperature: float) -> None:
    p.add_argument("--model", "-m", default=None,
                   help="a checkpoint directory, a .gguf file or a Hugging Face id in the local cache "
                        "(default: the shipped model)")
    p.add_argument("--device", "-d", default="auto", type=cmdline.device_name,
                   help="auto (default), cpu, wgpu, lavapipe")
    p.add_argument("--dtype", default="auto", choices=cmdline.DTYPE_CHOICES,
                   help="auto (default: as stored; quantized GGUF tensors stay quantized), float32, float16 (devices "
                        "with shader-f16) or q8_0 / int8 (q8_0 matrices, every device)")
    p.add_argument("--kv-dtype", default="auto", choices=("auto", "float32", "float16", "q8_0"),
                   help="the KV cache's type (auto: float16 on GPUs with shader-f16, else float32)")
    p.add_argument("--ctx-size", "-c", type=cmdline.integer("--ctx-size", 1), default=None,
                   help="positions per sequence (default: the model's context, at most 8192)")
    p.add_argument("-n", "--max-new-tokens", type=cmdline.checked(validate.check_max_new_tokens), default=None,
                   help="tokens to generate, >= 1 (default 50; chat: up to the end of the reply)")
    p.add_argument("--temperature", "-t", type=cmdline.checked(validate.check_temperature, float),
                   default=default_temperature, help=f">= 0; 0 = greedy (default {default_temperature})")
    p.add_argument("--top-k", type=cmdline.checked(validate.check_top_k), default=40,
                   help="keep the k likeliest tokens; 0 = off (default 40)")
    p.add_argument("--top-p", type=cmdline.checked(validate.check_top_p, float), default=0.95,
                   help="nucleus sampling, in (0, 1]; 1 = off (default 0.95)")
    p.add_argument("--seed", type=cmdline.checked(validate.check_seed), default=None, help="an integer >= 0")


def add_parsers(sub: Any) -> None:
    p = cmdline.add_command(sub, "generate", run=run_generate, check=check_generate,
                            help="generate text from a prompt (the shipped model unless --model)")
    p.add_argument("prompt", nargs="?", help="the prompt (read from stdin, as UTF-8, when omitted)")
    _model_args(p, 0.8)
    p.add_argument("--truncate-prompt", action="store_true", help="keep the prompt's last tokens if too long")
    c = cmdline.add_command(sub, "chat", run=run_chat, check=check_chat,
                            help="chat with a model in the terminal, the replies streamed (its chat template)")
    _model_args(c, 0.7)
    c.add_argument("--system", default=None, help="a system message to start the conversation with")


def _open(args: argparse.Namespace) -> Any:
    """The checkpoint (config, tokenizer, template) and the device, checked; no weights read yet."""
    from .device import Device
    from .models import loader

    args.dtype_name = loader.check_dtype(args.dtype)
    ck = loader.open_checkpoint(args.model)
    if args.ctx_size is not None and args.ctx_size > ck.config.spec.n_ctx:
        raise UsageError(f"--ctx-size {args.ctx_size} exceeds the model's context of {ck.config.spec.n_ctx}")
    device = args.device_obj = Device.parse(args.device)
    if args.dtype_name == "float16" and not device.has_f16:
        raise UsageError(f"--dtype float16: {device.describe()} has no shader-f16 feature; use --dtype float32")
    if ck.tokenizer is None:
        raise UsageError(f"{ck.where} has no tokenizer: text cannot be encoded")
    args.kv_dtype_name = None if args.kv_dtype == "auto" else args.kv_dtype
    if args.kv_dtype_name is not None:
        from .runtime.cache import check_kv_dtype

        try:
            check_kv_dtype(args.kv_dtype_name, ck.config.spec.head_dim, device.has_f16)
        except WebtensorError as e:
            raise UsageError(f"--kv-dtype {args.kv_dtype}: {e}") from None
    return ck


def check_generate(args: argparse.Namespace) -> None:
    """Every check of a run, cheapest first; sets args.prompt_text, args.checkpoint and args.device_obj."""
    text = args.prompt if args.prompt is not None else cmdline.read_stdin_text()
    args.prompt_text = validate.check_text(text)
    from .models import loader

    ck = args.checkpoint = _open(args)
    n_ctx = args.ctx_size or min(ck.config.spec.n_ctx, loader.DEFAULT_CTX)
    ids = validate.check_ids(ck.tokenizer.encode(args.prompt_text, add_special_tokens=True), ck.config.spec.vocab_size)
    validate.fit_context(ids, args.max_new_tokens or 50, n_ctx, args.truncate_prompt)


def check_chat(args: argparse.Namespace) -> None:
    if args.system is not None:
        validate.check_text(args.system)
    args.checkpoint = _open(args)


def _load(args: argparse.Namespace) -> Any:
    from .models import loader

    t0 = time.perf_counter()
    model = loader.build(args.checkpoint, args.device_obj, args.dtype_name, args.ctx_size, kv_dtype=args.kv_dtype_name)
    s = model.spec
    print(f"[webtensor] model {model.name} ({s.architecture}, {s.n_layer} layers, {s.width} wide, "
          f"{args.dtype_name or 'as stored'}, context {model.n_ctx}, KV {model.kv_dtype}) on "
          f"{args.device_obj.describe()}, loaded in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    return model


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def run_generate(args: argparse.Namespace) -> int:
    model = _load(args)
    cmdline.write(args.prompt_text)
    t1, n = time.perf_counter(), 0
    for piece in model.stream(args.prompt_text, args.max_new_tokens or 50, truncate_prompt=args.truncate_prompt,
                              **_sampling(args)):
        n += 1
        cmdline.write(piece)
    dt = time.perf_counter() - t1
    cmdline.write("\n")
    print(f"[webtensor] {n} pieces in {dt:.2f} s", file=sys.stderr)
    return 0


def run_chat(args: argparse.Namespace) -> int:
    """Read a message a line (Ctrl-D or /exit ends, /reset starts over), stream the reply. The conversation's
    tokens stay in the model's KV cache between turns: each turn computes only what the last one did not."""
    model = _load(args)
    tty = sys.stdin.isatty()
    if tty:
        print("[webtensor] chat: type a message and Enter; /reset starts over, /exit or Ctrl-D ends", file=sys.stderr)
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    while True:
        if tty:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        line = line.rstrip("\n")
        if line.strip() in ("/exit", "/quit"):
            break
        if line.strip() == "/reset":
            messages = list(start)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": validate.check_text(line)})
        ids = model.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        room = model.n_ctx - len(ids)
        if room < 1:
            raise UsageError(f"the conversation is {len(ids)} tokens, the context {model.n_ctx}: /reset to go on")
        pieces = []
        for piece in model.tokenizer.stream_decode(model.generate_ids(ids, min(args.max_new_tokens or room, room),
                                                                      reuse_prefix=True, **_sampling(args))):
            pieces.append(piece)
            cmdline.write(piece)
        cmdline.write("\n")
        messages.append({"role": "assistant", "content": "".join(pieces)})
    return 0
