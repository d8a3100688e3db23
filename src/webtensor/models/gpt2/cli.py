"""`webtensor generate`: stream GPT-2 text to stdout; which device and model went to stderr.

`check_generate` checks everything a run needs (the prompt's text and length against the context,
sampling parameters, the device and its dtype support, the checkpoint directory and tokenizer)
before `run_generate` loads the weights or prints anything."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ... import cmdline, validate
from ...errors import UsageError


def add_generate_parser(sub: Any) -> None:
    p = cmdline.add_command(sub, "generate", run=run_generate, check=check_generate,
                            help="generate text with GPT-2 (the shipped model unless --model)")
    p.add_argument("prompt", nargs="?", help="the prompt (read from stdin, as UTF-8, when omitted)")
    p.add_argument("--model", "-m", default=None,
                   help="checkpoint directory or Hugging Face id in the local cache (default: the shipped model)")
    p.add_argument("--device", "-d", default="auto", type=cmdline.device_name,
                   help="auto (default), cpu, wgpu, lavapipe")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "int8"],
                   help="float32, float16 (devices with shader-f16) or int8 (q8_0 weights, every device)")
    p.add_argument("-n", "--max-new-tokens", type=cmdline.checked(validate.check_max_new_tokens), default=50,
                   help="tokens to generate, >= 1 (default 50)")
    p.add_argument("--temperature", "-t", type=cmdline.checked(validate.check_temperature, float), default=0.8,
                   help=">= 0; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=cmdline.checked(validate.check_top_k), default=40,
                   help="keep the k likeliest tokens; 0 = off (default 40)")
    p.add_argument("--top-p", type=cmdline.checked(validate.check_top_p, float), default=0.95,
                   help="nucleus sampling, in (0, 1]; 1 = off (default 0.95)")
    p.add_argument("--seed", type=cmdline.checked(validate.check_seed), default=None, help="an integer >= 0")
    p.add_argument("--truncate-prompt", action="store_true", help="keep the prompt's last tokens if too long")


def check_generate(args: argparse.Namespace) -> None:
    """Every check of a run, cheapest first; sets args.prompt_text and args.device_obj."""
    from ...device import Device
    from ...text.tokenizer import GPT2Tokenizer
    from .config import GPT2Config
    from .weights import check_tokenizer, resolve

    text = args.prompt if args.prompt is not None else cmdline.read_stdin_text()
    args.prompt_text = validate.check_text(text)
    d = resolve(args.model)  # CheckpointError when missing
    cfg = GPT2Config.from_file(d / "config.json")
    tok = GPT2Tokenizer.from_dir(d)
    check_tokenizer(cfg, tok.vocab_size, d)  # a checkpoint error (exit 1) before any prompt id is judged
    ids = validate.check_ids(tok.encode(args.prompt_text), cfg.vocab_size)
    validate.fit_context(ids, args.max_new_tokens, cfg.n_positions, args.truncate_prompt)
    device = args.device_obj = Device.parse(args.device)
    if args.dtype == "float16" and not device.has_f16:
        raise UsageError(f"--dtype float16: {device.describe()} has no shader-f16 feature; use --dtype float32")


def run_generate(args: argparse.Namespace) -> int:
    from .model import GPT2

    device = args.device_obj
    t0 = time.perf_counter()
    model = GPT2.from_pretrained(args.model, device=device, dtype=args.dtype)
    cfg = model.config
    print(f"[webtensor] model {model.name} ({cfg.n_layer} layers, {cfg.n_embd} wide, {args.dtype}) on "
          f"{device.describe()}, loaded in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    cmdline.write(args.prompt_text)
    t1, n = time.perf_counter(), 0
    for piece in model.stream(args.prompt_text, args.max_new_tokens, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                              truncate_prompt=args.truncate_prompt):
        n += 1
        cmdline.write(piece)
    dt = time.perf_counter() - t1
    cmdline.write("\n")
    print(f"[webtensor] {n} pieces in {dt:.2f} s", file=sys.stderr)
    return 0
