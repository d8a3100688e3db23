"""`webtensor bench`: run the GPT-2 benchmark, print a table, write JSON and a PNG chart."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmark GPT-2 prefill and decode (optionally against HF transformers)")
    p.add_argument("--model", "-m", default="gpt2",
                   help="gpt2, gpt2-medium, gpt2-large, gpt2-xl (random weights) or a checkpoint directory")
    p.add_argument("--device", "-d", default="auto", help="auto, cpu, wgpu, lavapipe")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--prompts", default="128,1024", help="prefill prompt lengths, comma-separated")
    p.add_argument("--decode", type=int, default=128, help="tokens to decode (batch 1, greedy)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compare", action="store_true", help="also run HF transformers (torch) on the same weights")
    p.add_argument("--profile", action="store_true", help="GPU time per kernel of one decode step (timestamps)")
    p.add_argument("--json", dest="json_path", default=None)
    p.add_argument("--plot", dest="plot_path", default=None)
    p.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from ..device import Device
    from .gpt2_bench import bench_hf, bench_webtensor, build_model

    device = Device.parse(args.device)
    prompts = [int(x) for x in args.prompts.split(",") if x]
    model, arrays = build_model(args.model, device, args.dtype)
    n_ctx = model.config.n_positions
    prompts = [min(p, n_ctx - 1) for p in prompts]
    decode = min(args.decode, n_ctx - 9)
    steps = (len(prompts) + 1) * (2 if args.compare else 1)
    results = []
    with tqdm(total=steps, desc="bench", file=sys.stderr) as bar:
        results.append(bench_webtensor(model, prompts, decode, args.repeats, bar, args.profile))
        if args.compare:
            if arrays is None:
                from ..models.gpt2.model import _export_arrays

                arrays = _export_arrays(model)
            del model
            results.append(bench_hf(_cfg(args.model, results), arrays, args.dtype, prompts, decode, args.repeats, bar))
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.node(), "python": platform.python_version(),
        "command": "webtensor " + " ".join(sys.argv[1:]) if sys.argv else "", "model": args.model,
        "dtype": args.dtype, "results": [r.as_dict() for r in results],
    }
    if len(results) == 2:
        a, b = results
        report["ratios_webtensor_over_hf"] = {
            "decode_tok_s": a.decode_tok_s / b.decode_tok_s,
            **{f"prefill_{k}_tok_s": a.prefill_tok_s[k] / b.prefill_tok_s[k] for k in a.prefill_tok_s},
        }
    print_table(report)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot_path:
        plot(report, args.plot_path)
    return 0


def _cfg(spec: str, results: list) -> Any:
    from ..models.gpt2 import GPT2Config
    from ..models.gpt2.config import PRESETS

    if spec.split("/")[-1] in PRESETS:
        return GPT2Config.preset(spec)
    from ..models.gpt2.weights import resolve

    return GPT2Config.from_file(resolve(spec) / "config.json")


def print_table(report: dict) -> None:
    rows = report["results"]
    cols = ["engine", "device", "dtype", *[f"prefill {k} tok/s" for k in rows[0]["prefill_tok_s"]], "TTFT ms",
            "decode tok/s", "ms/token", "disp/step", "submits/step", "readbacks/step", "mem MB"]
    table = []
    for r in rows:
        ps = r["per_step"]
        table.append([r["engine"], r["device"][:40], r["dtype"], *[f"{v:,.0f}" for v in r["prefill_tok_s"].values()],
                      f"{r['ttft_ms']:.1f}", f"{r['decode_tok_s']:,.1f}", f"{r['decode_ms_per_token']:.3f}",
                      f"{ps.get('dispatches', 0):.0f}" if ps else "-", f"{ps.get('submits', 0):.2f}" if ps else "-",
                      f"{ps.get('readbacks', 0):.2f}" if ps else "-", f"{r['memory_mb']:.0f}"])
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for t in table:
        print("  ".join(x.ljust(w) for x, w in zip(t, widths, strict=True)))
    for k, v in report.get("ratios_webtensor_over_hf", {}).items():
        print(f"ratio webtensor / hf  {k}: {v:.2f}x")
    extra = rows[0].get("extra", {})
    for key, title in (("profile", "one decode step"), ("profile_prefill", "one prefill")):
        prof = extra.get(key)
        if prof:
            print(f"\nGPU time per kernel, {title} ({prof['dispatches']} dispatches, each timed alone):")
            for name, us in prof["kernels"]:
                print(f"  {name:40s} {us:9.1f} us")
            print(f"  {'total':40s} {prof['total_us']:9.1f} us")


def plot(report: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib (pip install 'webtensor[bench]')", file=sys.stderr)
        return
    rows = report["results"]
    metrics = [("decode tok/s", "decode_tok_s", None)] + [
        (f"prefill {k} tok/s", "prefill_tok_s", k) for k in rows[0]["prefill_tok_s"]]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.6))
    for ax, (title, field, key) in zip(axes, metrics, strict=True):
        vals = [r[field] if key is None else r[field][key] for r in rows]
        ax.bar([r["engine"] for r in rows], vals, color=["#3465a4", "#cc7a00"][: len(rows)])
        ax.set_title(title)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom")
    fig.suptitle(f"{report['model']} {report['dtype']} on {rows[0]['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
