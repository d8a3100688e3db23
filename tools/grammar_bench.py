"""What structured output costs a token: llguidance's mask (serve/grammar.py's `Constraint.mask`) and its
`consume`, for a JSON schema and for json_object, with the shipped tokenizer (4,096 ids) and SmolLM2's
(49,152 ids, from the GGUF file's metadata), following a random path through the grammar (each step a random
allowed token, as many steps as a document of that schema takes); the grammar's compile time; and
`ops.token_mask` (the mask applied to logits rows in the step graph) on the devices given.

    python tools/grammar_bench.py [--steps 400] [--devices cpu,lavapipe]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "address"],
          "properties": {"name": {"type": "string", "maxLength": 40},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8},
                         "address": {"type": "object", "additionalProperties": False,
                                     "required": ["city", "zip"],
                                     "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}}


def tokenizers() -> list[tuple[str, object, int, frozenset[int]]]:
    import webtensor as wt

    m = wt.load_model(None, device="cpu")
    out = [("shipped (4,096 ids)", m.tokenizer, m.vocab_size, m.eos_ids)]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from smollm2 import smollm2_path

    path = smollm2_path()
    if path is not None:
        from webtensor.formats.gguf_reader import GGUFCheckpoint
        from webtensor.models.loader import _gguf_tokenizer

        meta = GGUFCheckpoint(path).metadata
        V = len(meta["tokenizer.ggml.tokens"])
        eos = frozenset({int(meta["tokenizer.ggml.eos_token_id"])})
        out.append((f"SmolLM2 ({V:,} ids)", _gguf_tokenizer(meta, V, str(path)), V, eos))
    return out


def bench_grammar(name: str, tok: object, V: int, eos: frozenset[int], steps: int) -> None:
    from webtensor.serve import grammar as g

    t0 = time.perf_counter()
    lt = g.grammar_tokenizer(tok, V, eos)
    t_tok = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    for kind, schema in (("json_schema", SCHEMA), ("json_object", None)):
        t0 = time.perf_counter()
        grammar = g.compile_format(kind, schema)
        g.check(grammar, lt)
        c = g.Constraint(lt, grammar, V)
        t_compile = time.perf_counter() - t0
        masks, consumes, n = [], [], 0
        while n < steps:
            t0 = time.perf_counter()
            mask = c.mask()
            masks.append(time.perf_counter() - t0)
            allowed = np.flatnonzero(g.unpack(mask, V))
            tok_id = int(rng.choice(allowed))
            if tok_id in eos:  # a document done: start another
                c = g.Constraint(lt, grammar, V)
                continue
            t0 = time.perf_counter()
            c.consume(tok_id)
            consumes.append(time.perf_counter() - t0)
            n += 1
        ms = sorted(masks)
        print(f"{name:22s} {kind:11s} tokenizer {t_tok * 1e3:7.1f} ms, compile {t_compile * 1e3:6.1f} ms; "
              f"mask median {statistics.median(ms) * 1e6:7.1f} us, p90 {ms[int(0.9 * len(ms))] * 1e6:7.1f} us, "
              f"max {ms[-1] * 1e6:8.1f} us; consume median {statistics.median(consumes) * 1e6:5.1f} us "
              f"({len(masks)} masks)", flush=True)


def bench_op(device: str, V: int, rows: int, reps: int = 50) -> None:
    import webtensor as wt
    from webtensor import ops

    dev = wt.Device.parse(device)
    rng = np.random.default_rng(0)
    x = wt.tensor(rng.standard_normal((rows, V)).astype(np.float32), device=dev)
    bits = wt.tensor(rng.integers(-2**31, 2**31, (rows, (V + 31) // 32)).astype(np.int32), device=dev)
    ops.token_mask(x, bits).numpy()  # (compiled, warm)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ops.token_mask(x, bits).numpy()
        ts.append(time.perf_counter() - t0)
    t_read = []
    for _ in range(reps):  # the readback alone, to subtract
        t0 = time.perf_counter()
        x.numpy()
        t_read.append(time.perf_counter() - t0)
    print(f"token_mask on {dev.describe()}: {rows} x {V:,} logits: {statistics.median(ts) * 1e6:8.1f} us with "
          f"the readback ({statistics.median(t_read) * 1e6:8.1f} us for the readback alone)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--devices", default="cpu,lavapipe")
    a = ap.parse_args()
    toks = tokenizers()
    for name, tok, V, eos in toks:
        bench_grammar(name, tok, V, eos, a.steps)
    for device in a.devices.split(","):
        for _, _, V, _ in toks:
            for rows in (1, 32):
                bench_op(device, V, rows)


if __name__ == "__main__":
    main()
