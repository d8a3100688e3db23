"""`webtensor generate`: stream GPT-2 text to stdout; which device and model went to stderr."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ...errors import WebtensorError


def add_generate_parser(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate text with GPT-2 (the shipped model unless --model)")
    p.add_argument("prompt", nargs="?", help="the prompt (read from stdin when omitted)")
    p.add_argument("--model", "-m", default=None,
                   help="checkpoint directory or Hugging Face id in the local cache (default: the shipped model)")
    p.add_argument("--device", "-d", default="auto", help="auto (default), cpu, wgpu, lavapipe")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("-n", "--max-new-tokens", type=int, default=50)
    p.add_argument("--temperature", "-t", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--truncate-prompt", action="store_true", help="keep the prompt's last tokens if too long")
    p.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from ...device import Device
    from .model import GPT2

    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    try:
        device = Device.parse(args.device)
        t0 = time.perf_counter()
        model = GPT2.from_pretrained(args.model, device=device, dtype=args.dtype)
        cfg = model.config
        print(f"[webtensor] model {model.name} ({cfg.n_layer} layers, {cfg.n_embd} wide, {args.dtype}) on "
              f"{device.describe()}, loaded in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        sys.stdout.write(prompt)
        sys.stdout.flush()
        t1, n = time.perf_counter(), 0
        top_k = args.top_k if args.top_k and args.top_k > 0 else None
        for piece in model.stream(prompt, args.max_new_tokens, temperature=args.temperature, top_k=top_k,
                                  top_p=args.top_p, seed=args.seed, truncate_prompt=args.truncate_prompt):
            n += 1
            sys.stdout.write(piece)
            sys.stdout.flush()
        dt = time.perf_counter() - t1
        sys.stdout.write("\n")
        print(f"[webtensor] {n} pieces in {dt:.2f} s", file=sys.stderr)
    except WebtensorError as e:
        print(f"webtensor: error: {e}", file=sys.stderr)
        return 2
    return 0



