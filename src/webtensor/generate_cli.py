"""`webtensor generate` (stream a continuation of a prompt to stdout), for any model `load_model` reads: `--model` is
a checkpoint directory, a .gguf file or an id in the local Hugging Face cache (default: the small model shipped with
webtensor); and what it shares with `webtensor chat` (chat_cli.py): the model and sampling options, opening the
checkpoint, loading the model.

`check_generate` checks everything a run needs (the prompt's text and length against the context, the sampling
parameters, the device and its dtype support, the checkpoint's config and tokenizer) before the weights load or
anything is printed; which model and device go to stderr, the text to stdout."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from . import cmdline, validate
from .errors import UsageError, WebtensorError


def model_args(p: argparse.ArgumentParser, default_temperature: float) -> None:
    p.add_argument("--model", "-m", default=None,
                   help="a checkpoint directory, a .gguf file or a Hugging Face id in the local cache "
                        "(default: the shipped model)")
    p.add_argument("--device", "-d", default="auto", type=cmdline.device_name,
                   help="auto (default), cpu, wgpu, wgpu:N (adapter N of `webtensor devices`), lavapipe")
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
    cmdline.add_blas_threads(p)


def add_parsers(sub: Any) -> None:
    p = cmdline.add_command(sub, "generate", run=run_generate, check=check_generate,
                            help="generate text from a prompt (the shipped model unless --model)")
    p.add_argument("prompt", nargs="?", help="the prompt (read from stdin, as UTF-8, when omitted)")
    model_args(p, 0.8)
    p.add_argument("--truncate-prompt", action="store_true", help="keep the prompt's last tokens if too long")
    from . import chat_cli

    chat_cli.add_parser(sub)


def open_checkpoint(args: argparse.Namespace) -> Any:
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

    ck = args.checkpoint = open_checkpoint(args)
    n_ctx = args.ctx_size or min(ck.config.spec.n_ctx, loader.DEFAULT_CTX)
    ids = validate.check_ids(ck.tokenizer.encode(args.prompt_text, add_special_tokens=True), ck.config.spec.vocab_size)
    validate.fit_context(ids, args.max_new_tokens or 50, n_ctx, args.truncate_prompt)


def load(args: argparse.Namespace) -> Any:
    """The model `args` name (checked by `open_checkpoint`), on its device; says which on stderr."""
    from .models import loader

    cmdline.use_blas_threads(args.blas_threads)
    t0 = time.perf_counter()
    model = loader.build(args.checkpoint, args.device_obj, args.dtype_name, args.ctx_size, kv_dtype=args.kv_dtype_name)
    s = model.spec
    print(f"[webtensor] model {model.name} ({s.architecture}, {s.n_layer} layers, {s.width} wide, "
          f"{args.dtype_name or 'as stored'}, context {model.n_ctx}, KV {model.kv_dtype}) on "
          f"{args.device_obj.describe()}, loaded in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    return model


def sampling(args: argparse.Namespace) -> dict[str, Any]:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def run_generate(args: argparse.Namespace) -> int:
    model = load(args)
    cmdline.write(args.prompt_text)
    t1, n = time.perf_counter(), 0
    for piece in model.stream(args.prompt_text, args.max_new_tokens or 50, truncate_prompt=args.truncate_prompt,
                              **sampling(args)):
        n += 1
        cmdline.write(piece)
    dt = time.perf_counter() - t1
    cmdline.write("\n")
    print(f"[webtensor] {n} pieces in {dt:.2f} s", file=sys.stderr)
    return 0
