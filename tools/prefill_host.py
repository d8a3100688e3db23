"""The host (Python) cost of a prompt pass, per dispatch: where GPU work is negligible.

A random SmolLM2-shaped checkpoint (the `smollm2-135m` preset's 30 layers, 9 heads over 3 KV heads, tied
embedding) with tiny widths (hidden 144, MLP 96, vocab 512: head dim 16 by default) runs `ModelRunner.prefill` of a
T-token prompt on a WebGPU device, its chunks replayed graphs (`--eager`: the same chunks' forwards planned op by
op, the host cost the graphs remove); each pass is timed on the wall clock (it ends with the logits read back, so
the GPU work is inside it). Prints the dispatches a pass records (the context's counter), the median wall time
of a pass and the median µs per dispatch, split into the three parts of a pass: `plan` (the Python of the
forward: planning each op, allocating results, packing parameters, bind groups; what this tool is for),
`submit` (encoding the pending commands and wgpu-native's queue submit; on lavapipe the submit also runs the
kernels, ~70 µs a dispatch even at these widths) and `wait` (the readback). The split times the backend's
`submit_async` and `finish` by wrapping them on this process's device object (nothing else changes); with
`--profile`, a cProfile of `--profile-passes` more passes sorted by own time (and cumulative time), so the hot
spots of planning, allocation, bind groups and encoding stand out. `--gpu-kernels` plans as on a GPU (the kernel
policy's gpu_style and the H200's 132 compute units: the matmul engine with split-K, the tiled attention), so
the planners a real GPU's prefill runs are the ones timed; lavapipe then runs kernels written for GPUs (slowly,
which shows in `submit`, not in `plan`).

    PYTHONPATH=$PWD/src CI=true .venv/bin/python tools/prefill_host.py [--device lavapipe] [--tokens 16]
        [--repeats 20] [--n-layer 30] [--hidden 144] [--gpu-kernels] [--eager] [--profile] [--top 40] [--json out.json]

The real SmolLM2-135M prefill (128 tokens, float16) on a GPU: `webtensor bench -m smollm2-135m --dtype float16
--prompts 128,1024 --decode 16 --repeats 3`.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from typing import Any


def build(device: str, n_layer: int, hidden: int, mlp: int, vocab: int, dtype: str | None) -> Any:
    """A random model of SmolLM2-135M's structure with the given widths (9 heads, 3 KV heads)."""
    from webtensor.models import loader, registry

    found = registry.preset("smollm2-135m")
    assert found is not None
    family, _, raw = found
    raw = dict(raw, num_hidden_layers=n_layer, hidden_size=hidden, intermediate_size=mlp, vocab_size=vocab,
               max_position_embeddings=512, bos_token_id=0, eos_token_id=0)
    cfg = family.config_from_hf(raw, "tools/prefill_host.py")
    return loader.random(family.name, cfg, device=device, dtype=dtype, n_ctx=512)


def _timed(obj: Any, name: str, acc: dict[str, float], key: str) -> None:
    """Wrap method `name` of instance `obj` so that its time adds up in acc[key]."""
    fn = getattr(obj, name)

    def wrapper(*args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            acc[key] += time.perf_counter() - t0

    setattr(obj, name, wrapper)


def measure(model: Any, tokens: int, repeats: int, eager: bool = False) -> dict[str, Any]:
    """Median wall time of `runner.prefill` of `tokens` tokens (read back), its split into plan / submit / wait
    (WebGPU), and the dispatches of one pass; `eager`: a runner without graphs."""
    runner = model.runner(1, use_graph=not eager)
    ctx = getattr(model.device.backend, "ctx", None)
    ids = [(7 * i + 3) % model.vocab_size for i in range(tokens)]
    acc = {"submit": 0.0, "wait": 0.0}
    if ctx is not None:
        _timed(ctx.api, "submit_async", acc, "submit")
        _timed(ctx.api, "finish", acc, "wait")

    def one() -> None:
        runner.prefill(0, ids).numpy()

    for _ in range(3):  # warm-up: kernels compiled, pool and bind-group cache filled
        one()
    before = dict(ctx.counters) if ctx is not None else {}
    one()
    after = dict(ctx.counters) if ctx is not None else {}
    per_pass = {k: after[k] - before[k] for k in after}
    times, parts = [], []
    for _ in range(repeats):
        acc.update(submit=0.0, wait=0.0)
        t0 = time.perf_counter()
        one()
        times.append(time.perf_counter() - t0)
        parts.append((times[-1] - acc["submit"] - acc["wait"], acc["submit"], acc["wait"]))
    ms = statistics.median(times) * 1e3
    plan, submit, wait = (statistics.median(p[i] for p in parts) * 1e3 for i in range(3))
    n = per_pass.get("dispatches", 0)
    return dict(device=model.device.describe(), tokens=tokens, prefill_ms=ms, prefill_ms_min=min(times) * 1e3,
                plan_ms=plan, submit_ms=submit, wait_ms=wait, dispatches=n,
                us_per_dispatch=ms * 1e3 / n if n else None, plan_us_per_dispatch=plan * 1e3 / n if n else None,
                per_pass=per_pass, run=one)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="lavapipe", help="lavapipe (default), wgpu or cpu")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--n-layer", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=144, help="hidden size (a multiple of 9 heads)")
    ap.add_argument("--mlp", type=int, default=96)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--dtype", default=None, help="weights' dtype (default: the device's choice)")
    ap.add_argument("--gpu-kernels", action="store_true", help="plan as on a GPU (132 compute units)")
    ap.add_argument("--eager", action="store_true", help="the prompt's chunks op by op (no graphs)")
    ap.add_argument("--profile", action="store_true", help="cProfile some more passes")
    ap.add_argument("--profile-passes", type=int, default=10)
    ap.add_argument("--top", type=int, default=40, help="profile rows printed")
    ap.add_argument("--json", dest="json_path", default=None)
    a = ap.parse_args(argv)
    model = build(a.device, a.n_layer, a.hidden, a.mlp, a.vocab, a.dtype)
    if a.gpu_kernels:
        model.device.kernel_policy = model.device.kernel_policy.replace(gpu_style=True, compute_units=132)
    r = measure(model, a.tokens, a.repeats, a.eager)
    run = r.pop("run")
    print(f"{r['device']}: prefill of {a.tokens} tokens, {a.n_layer} layers: {r['prefill_ms']:.2f} ms median "
          f"(min {r['prefill_ms_min']:.2f}), {r['dispatches']} dispatches, "
          f"{r['us_per_dispatch'] or 0:.1f} µs per dispatch")
    print(f"  plan {r['plan_ms']:.2f} ms ({r['plan_us_per_dispatch'] or 0:.1f} µs per dispatch), "
          f"submit {r['submit_ms']:.2f} ms, wait {r['wait_ms']:.2f} ms (medians)")
    print("per pass:", {k: v for k, v in r["per_pass"].items() if v})
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.profile_passes):
            run()
        prof.disable()
        for key in ("tottime", "cumtime"):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(key).print_stats(a.top)
            print(out.getvalue())
    if a.json_path:
        with open(a.json_path, "w") as f:
            json.dump(r, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
