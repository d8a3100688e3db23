"""`webtensor bench`: run the GPT-2 benchmark, print a table, write JSON and a PNG chart."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from .. import cmdline
from ..errors import UsageError, WebtensorError


def add_parser(sub: Any) -> None:
    p = cmdline.add_command(sub, "bench", run=run_bench, check=check_bench,
                            help="benchmark GPT-2 prefill and decode (optionally against HF transformers)")
    p.add_argument("--model", "-m", default="gpt2",
                   help="gpt2, gpt2-medium, gpt2-large, gpt2-xl (random weights) or a checkpoint directory")
    p.add_argument("--device", "-d", default="auto", type=cmdline.device_name, help="auto, cpu, wgpu, lavapipe")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "int8"],
                   help="float32, float16 (devices with shader-f16) or int8 (q8_0 weights, every device)")
    p.add_argument("--prompts", default=[128, 1023], type=cmdline.int_list("--prompts"),
                   help="prefill prompt lengths, comma-separated, each < the context (default 128,1023)")
    p.add_argument("--decode", type=cmdline.integer("--decode", 1), default=128,
                   help="tokens to decode (greedy)")
    p.add_argument("--batch", type=cmdline.integer("--batch", 1), default=1,
                   help="sequences decoding together (decode tok/s is then the batch's aggregate)")
    p.add_argument("--repeats", type=cmdline.integer("--repeats", 1), default=3)
    p.add_argument("--processes", type=cmdline.integer("--processes", 1), default=3,
                   help="fresh processes the whole measurement runs in, one after the other (default 3): the "
                        "table and the ratios give the median over them, min / median / max are printed and "
                        "in the JSON; 1 runs it in this process")
    p.add_argument("--compare", action="store_true",
                   help="also run, on the same weights, HF transformers and a hand-written torch GPT-2 step "
                        "(static KV cache, SDPA; on CUDA the decode step replayed as a CUDA graph: "
                        "'torch+cudagraph'; on the CPU eagerly: 'torch-step (cpu)', float32 only) "
                        "with ratios against both")
    p.add_argument("--profile", action="store_true", help="GPU time per kernel of one decode step (timestamps)")
    p.add_argument("--json", dest="json_path", default=None)
    p.add_argument("--plot", dest="plot_path", default=None)


def check_bench(args: argparse.Namespace) -> None:
    """Everything the run needs, before the (long) run: sizes within the model's context, output
    paths writable, optional packages present, the device and its dtype support."""
    from ..device import Device

    n_ctx = _cfg(args.model, []).n_positions  # CheckpointError for a missing checkpoint
    too_long = [n for n in args.prompts if n > n_ctx - 1]
    if too_long:
        raise UsageError(f"--prompts {too_long[0]}: a prefill of {too_long[0]} tokens does not fit the model's "
                         f"context of {n_ctx} (at most {n_ctx - 1})")
    if args.decode > n_ctx - 9:
        raise UsageError(f"--decode {args.decode}: decoding after an 8-token prompt fits at most {n_ctx - 9} "
                         f"tokens in the model's context of {n_ctx}")
    for flag, path in (("--json", args.json_path), ("--plot", args.plot_path)):
        if path is not None:
            _check_writable(flag, path)
    if args.plot_path and importlib.util.find_spec("matplotlib") is None:
        raise WebtensorError("--plot needs matplotlib (pip install 'webtensor[bench]')")
    if args.compare:
        missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
        if missing:
            raise WebtensorError(f"--compare needs {' and '.join(missing)} (pip install 'webtensor[test]')")
    args.device_obj = Device.parse(args.device)
    if args.profile and args.device_obj.kind != "wgpu":
        raise UsageError(f"--profile times GPU kernels: it needs a WebGPU device, not {args.device_obj.describe()}")
    if args.dtype == "float16" and not args.device_obj.has_f16:
        raise UsageError(f"--dtype float16: {args.device_obj.describe()} has no shader-f16 feature; "
                         "use --dtype float32")


def _check_writable(flag: str, path: str) -> None:
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name")
    if not folder.is_dir():
        raise UsageError(f"{flag} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"{flag} {path}: not writable")


def run_bench(args: argparse.Namespace) -> int:
    if args.processes > 1:
        return _run_processes(args)
    from tqdm.auto import tqdm

    from .gpt2_bench import bench_hf, bench_torch_step, bench_webtensor, build_model, hf_model

    device = args.device_obj
    model, arrays = build_model(args.model, device, args.dtype)
    prompts, decode = args.prompts, args.decode  # check_bench: both fit the context
    engines = 3 if args.compare else 1
    results = []
    notes: list[str] = []
    with tqdm(total=(len(prompts) + 1) * engines, desc="bench", file=sys.stderr) as bar:
        results.append(bench_webtensor(model, prompts, decode, args.repeats, bar, args.profile, args.batch))
        if args.compare:
            if arrays is None:
                from ..models.gpt2.model import _export_arrays

                arrays = _export_arrays(model)
            del model
            cfg = _cfg(args.model, results)
            hf = hf_model(cfg, arrays, args.dtype)
            del arrays
            results.append(bench_hf(hf, cfg, args.dtype, prompts, decode, args.repeats, bar, args.batch))
            if args.dtype == "float16" and hf.device.type != "cuda":
                notes.append("torch step: float16 runs only on CUDA; not run")
                bar.update(len(prompts) + 1)
            else:
                results.append(bench_torch_step(hf, cfg, args.dtype, prompts, decode, args.repeats, bar,
                                                args.batch))
                agree = results[-1].extra["tokens_agreeing_with_hf"]
                notes.append(f"torch step: its first {agree} of {decode + 1} greedy tokens are HF's")
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.node(), "python": platform.python_version(),
        "command": "webtensor " + " ".join(sys.argv[1:]) if sys.argv else "", "model": args.model,
        "dtype": args.dtype, "results": [r.as_dict() for r in results], "notes": notes,
    }
    for key, other in (("ratios_webtensor_over_hf", 1), ("ratios_webtensor_over_torch_step", 2)):
        if len(results) > other:
            report[key] = _ratios(results[0], results[other])
    print_table(report)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot_path:
        plot(report, args.plot_path)
    return 0


def _child_argv(args: argparse.Namespace, json_path: str) -> list[str]:
    """`bench` arguments that run this measurement once, in one process, writing `json_path`."""
    argv = ["bench", "--model", args.model, "--device", args.device, "--dtype", args.dtype,
            "--prompts", ",".join(map(str, args.prompts)), "--decode", str(args.decode), "--batch", str(args.batch),
            "--repeats", str(args.repeats), "--processes", "1", "--json", json_path]
    return argv + (["--compare"] if args.compare else []) + (["--profile"] if args.profile else [])


METRICS = ("ttft_ms", "decode_tok_s", "decode_ms_per_token")


def _run_processes(args: argparse.Namespace) -> int:
    """The measurement in `args.processes` fresh processes (`python -m webtensor.cli bench ...
    --processes 1`), one after the other: a figure counts only if it holds across processes. The
    report's `results` are the first process's with every figure replaced by the median over the
    processes; `spread` has [min, median, max] of each; `processes` every process's report."""
    import statistics
    import subprocess
    import tempfile

    if args.device_obj.kind == "wgpu":
        args.device_obj.release()  # (the children open their own)
    reports = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.processes):
            path = os.path.join(tmp, f"p{i}.json")
            r = subprocess.run([sys.executable, "-m", "webtensor.cli", *_child_argv(args, path)],
                               stdout=subprocess.PIPE, text=True)
            print(f"== process {i + 1} of {args.processes}\n{r.stdout}", end="")
            if r.returncode != 0:
                raise WebtensorError(f"bench: process {i + 1} of {args.processes} failed (exit {r.returncode})")
            with open(path) as f:
                reports.append(json.load(f))
    results, spread = [], {}
    for e, first in enumerate(reports[0]["results"]):
        runs = [rep["results"][e] for rep in reports]
        merged = dict(first)
        sp: dict[str, list[float]] = {}
        for m in METRICS:
            vals = [r[m] for r in runs]
            merged[m], sp[m] = statistics.median(vals), [min(vals), statistics.median(vals), max(vals)]
        for field in ("prefill_tok_s", "prefill_ms"):
            merged[field] = {}
            for k in first[field]:
                vals = [r[field][k] for r in runs]
                merged[field][k] = statistics.median(vals)
                sp[f"{field}/{k}"] = [min(vals), statistics.median(vals), max(vals)]
        results.append(merged)
        spread[first["engine"]] = sp
    report = dict(reports[0], results=results, spread=spread, processes=reports,
                  command="webtensor " + " ".join(sys.argv[1:]) if sys.argv else "")
    for key, other in (("ratios_webtensor_over_hf", 1), ("ratios_webtensor_over_torch_step", 2)):
        if len(results) > other:
            report[key] = _ratios(_Figures(results[0]), _Figures(results[other]))
    print(f"== median of {args.processes} processes")
    print_table(report)
    print_spread(report)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot_path:
        plot(report, args.plot_path)
    return 0


class _Figures:
    """A result dict seen as a BenchResult (the attributes `_ratios` reads)."""

    def __init__(self, d: dict[str, Any]):
        self.decode_tok_s, self.prefill_tok_s = d["decode_tok_s"], d["prefill_tok_s"]


def print_spread(report: dict) -> None:
    n = len(report.get("processes", []))
    print(f"\nmin / median / max over {n} fresh processes:")
    for engine, sp in report.get("spread", {}).items():
        for name, (lo, mid, hi) in sp.items():
            if name.startswith("prefill_tok_s") or name == "decode_tok_s":
                label = "decode" if name == "decode_tok_s" else "prefill " + name.split("/")[1]
                print(f"  {engine:<18} {label:<14} "
                      f"{lo:>12,.1f} {mid:>12,.1f} {hi:>12,.1f} tok/s  (max / min {hi / lo:.2f})")


def _ratios(a: Any, b: Any) -> dict[str, float]:
    """a / b for decode tok/s and each prefill length's tok/s (two BenchResults)."""
    return {"decode_tok_s": a.decode_tok_s / b.decode_tok_s,
            **{f"prefill_{k}_tok_s": a.prefill_tok_s[k] / b.prefill_tok_s[k] for k in a.prefill_tok_s}}


def _cfg(spec: str, results: list) -> Any:
    from ..models.gpt2 import GPT2Config
    from ..models.gpt2.config import PRESETS

    if spec.split("/")[-1] in PRESETS:
        return GPT2Config.preset(spec)
    from ..formats.safetensors_reader import resolve

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
    for key, name in (("ratios_webtensor_over_hf", "hf"), ("ratios_webtensor_over_torch_step", "torch step")):
        for k, v in report.get(key, {}).items():
            print(f"ratio webtensor / {name}  {k}: {v:.2f}x")
    for note in report.get("notes", []):
        print(note)
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
        ax.bar([r["engine"] for r in rows], vals, color=["#3465a4", "#cc7a00", "#4e9a06"][: len(rows)])
        ax.set_title(title)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom")
    fig.suptitle(f"{report['model']} {report['dtype']} on {rows[0]['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
