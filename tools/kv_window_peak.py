"""The KV pool a model whose every layer slides holds, keeping every block of a sequence (as before) and giving back
the blocks behind the window (docs/design-kv.md, "Sliding windows"), side by side in one process: a random
checkpoint of the conformance suite's Mistral example (or any `--set` of its fields) with `--window` and
`--ctx`.

- one sequence (`ModelRunner`, what `generate` and the page run): a `--prompt`-token prompt and `--new` greedy
  tokens; the pool's high-water mark in blocks and in bytes (this shape's, and a Mistral-7B's: 32 layers, 8 KV heads
  of 128, float16: 128 KiB a position), the default pool a runner allocates (its whole context, or what a windowed
  sequence holds at most), decode tok/s (the host's bookkeeping of giving blocks back);
- the server's scheduler (the batched engine, in process): `--requests` requests of `--prompt` + `--serve-new`
  tokens arriving together in a pool of `--pool` blocks: wall time (the faster of two rounds, the two ways
  interleaved: each engine captures its graphs in its first), preemptions, the high-water mark.

    python tools/kv_window_peak.py [--device cpu|lavapipe] [--window 32] [--ctx 1024] [--prompt 64] [--new 900]
        [--requests 8] [--pool 64] [--serve-new 400] [--set KEY=JSON ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import webtensor as wt
from webtensor.models import loader, registry
from webtensor.runtime.blocks import HOLE
from webtensor.runtime.cache import BLOCK_SIZE, sequence_blocks
from webtensor.runtime.generate import generate
from webtensor.runtime.runner import ModelRunner

MISTRAL_7B_POSITION = 2 * 32 * 8 * 128 * 2  # bytes a position: keys and values, 32 layers, 8 KV heads of 128, f16


def _model(a: argparse.Namespace) -> Any:
    fam = registry.by_name("llama")
    raw = {**fam.examples["mistral"], "sliding_window": a.window, "max_position_embeddings": a.ctx}
    for kv in a.set:
        k, v = kv.split("=", 1)
        raw[k] = json.loads(v)
    cfg = fam.config_from_hf(raw, "tools/kv_window_peak.py")
    m = loader.random("llama", cfg, device=a.device, n_ctx=a.ctx, kv_dtype="float32")
    m.tokenizer = wt.load_model(None, "cpu").tokenizer  # (the shipped one: 4,096 ids, for the server's text)
    return m


def _one_sequence(m: Any, a: argparse.Namespace, keep: bool) -> dict[str, Any]:
    r = ModelRunner(m, 1, bucketed=False, kv_blocks=-(-a.ctx // BLOCK_SIZE))
    default_pool = -(-a.ctx // BLOCK_SIZE) if keep else sequence_blocks(m, r.step_rows)
    if keep:
        r.kv_window = None
    ids = [1 + i * 7 % 4000 for i in range(a.prompt)]
    list(generate(r, ids, 8, True, None))  # (graphs captured)
    r.release(0)
    t0 = time.perf_counter()
    n = len(list(generate(r, ids, a.new, True, None)))
    dt = time.perf_counter() - t0
    out = dict(peak=r.blocks.peak, holes=sum(1 for b in r._owned[0] if b == HOLE), default_pool=default_pool,
               tok_s=n / dt)
    r.close()
    return out


def _serve(m: Any, a: argparse.Namespace, keep: bool) -> dict[str, Any]:
    from webtensor.serve.engine import ModelEngine, Sampling
    from webtensor.serve.scheduler import Generation, Scheduler

    engine = ModelEngine(m, a.requests, kv_blocks=a.pool)
    if keep:
        engine.kv_window = None

    async def go() -> tuple[float, Scheduler]:
        sched = Scheduler(engine, max_queue=a.requests)
        sched.start()
        gens = [Generation([1 + (i * 31 + j * 7) % 4000 for j in range(a.prompt)], a.serve_new, Sampling(),
                           ignore_eos=True) for i in range(a.requests)]
        t0 = time.perf_counter()
        for g in gens:
            sched.submit(g)

        async def drain(g: Generation) -> None:
            async for _ in g.stream():
                pass
        await asyncio.gather(*(drain(g) for g in gens))
        dt = time.perf_counter() - t0
        await sched.stop()
        return dt, sched
    dt, sched = asyncio.run(go())
    engine.close()
    assert sched.kv is not None
    return dict(seconds=dt, preemptions=int(sched.metrics.preemptions._value.get()), peak=sched.kv.peak,
                tok_s=a.requests * a.serve_new / dt)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new", type=int, default=900)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--pool", type=int, default=64)
    p.add_argument("--serve-new", type=int, default=400)
    p.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    a = p.parse_args()
    a.device = wt.Device.parse(a.device)
    m = _model(a)
    print(m.describe())
    one = {keep: _one_sequence(m, a, keep) for keep in (True, False)}
    block = m.position_bytes() * BLOCK_SIZE
    print(f"\none sequence: {a.prompt} + {a.new} tokens, window {a.window}, context {a.ctx}")
    print("| blocks | high-water mark (blocks) | this shape | a Mistral-7B's | default pool (blocks) | decode tok/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for keep, name in ((True, "kept (before)"), (False, "given back")):
        o = one[keep]
        print(f"| {name} | {o['peak']} | {o['peak'] * block / 2**10:.0f} KiB | "
              f"{o['peak'] * BLOCK_SIZE * MISTRAL_7B_POSITION / 2**20:.0f} MiB | {o['default_pool']} | "
              f"{o['tok_s']:.0f} |")
    if a.requests:
        rounds = [(keep, _serve(m, a, keep)) for _ in range(2) for keep in (True, False)]
        srv = {keep: min((o for k, o in rounds if k == keep), key=lambda o: o["seconds"]) for keep in (True, False)}
        print(f"\nserver: {a.requests} requests of {a.prompt} + {a.serve_new} tokens together, a pool of {a.pool} "
              f"blocks ({a.pool * BLOCK_SIZE} positions)")
        print("| blocks | wall s | tok/s | preemptions | high-water mark (blocks) |")
        print("|---|---:|---:|---:|---:|")
        for keep, name in ((True, "kept (before)"), (False, "given back")):
            o = srv[keep]
            print(f"| {name} | {o['seconds']:.2f} | {o['tok_s']:.0f} | {o['preemptions']} | {o['peak']} |")


if __name__ == "__main__":
    main()
