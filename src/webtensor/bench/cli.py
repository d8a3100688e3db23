"""`webtensor bench`: measure any model `load_model` reads (or a preset's random weights) on a webtensor device,
optionally beside HF transformers, a hand-written torch step and llama.cpp's llama-bench on the same weights; print
a table, write JSON and a PNG chart."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import cmdline
from ..errors import UsageError, WebtensorError

DTYPES = {"auto": None, "float32": "float32", "float16": "float16", "q8_0": "q8_0", "int8": "q8_0"}


def add_parser(sub: Any) -> None:
    p = cmdline.add_command(sub, "bench", run=run_bench, check=check_bench,
                            help="benchmark a model's prefill and decode (optionally beside HF transformers, a "
                                 "torch step and llama.cpp)")
    p.add_argument("--model", "-m", default="gpt2",
                   help="a checkpoint directory, a .gguf file, an id in the local Hugging Face cache, or a preset "
                        "of random weights: gpt2, gpt2-medium, gpt2-large, gpt2-xl, smollm2-135m, smollm2-360m, "
                        "qwen2.5-0.5b, qwen3-0.6b, llama-3.2-1b (default gpt2)")
    p.add_argument("--device", "-d", default="auto", type=cmdline.device_name, help="auto, cpu, wgpu, wgpu:N, lavapipe")
    p.add_argument("--dtype", default="auto", choices=list(DTYPES),
                   help="auto: as stored (a GGUF file's quantized tensors kept); float32; float16 (devices with "
                        "shader-f16); q8_0 / int8 (float matrices quantized at load, every device)")
    p.add_argument("--kv-dtype", default="auto", choices=("auto", "float32", "float16", "q8_0"),
                   help="the KV cache's type (auto: float16 on GPUs with shader-f16, else float32)")
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
                   help="also run, on the same weights, HF transformers and a hand-written torch step of the "
                        "model's architecture (static KV cache, SDPA; on CUDA the decode step replayed as a CUDA "
                        "graph: 'torch+cudagraph'; on the CPU eagerly: 'torch-step (cpu)', float32 only) "
                        "with ratios against both")
    p.add_argument("--llama-bench", dest="llama_bench", default=None, metavar="PATH",
                   help="also run llama.cpp's llama-bench binary at PATH on a GGUF file of the same weights (the "
                        ".gguf given, or one written for the run in --dtype), its figures beside webtensor's")
    p.add_argument("--llama-bench-args", dest="llama_bench_args", default="", metavar="ARGS",
                   help="more arguments for llama-bench, e.g. '-t 2' (threads) or '-ngl 0'")
    p.add_argument("--cpu-threads", dest="cpu_threads", type=cmdline.integer("--cpu-threads", 0), default=0,
                   help="threads of the host-side math: numpy's OpenBLAS (the CPU device's products) and torch (the "
                        "--compare anchors); 0 (default): each library's own choice, one per core. On a machine "
                        "shared with other work, 1 avoids OpenBLAS's threads spinning for a core")
    p.add_argument("--profile", action="store_true", help="GPU time per kernel of one decode step (timestamps)")
    p.add_argument("--json", dest="json_path", default=None)
    p.add_argument("--plot", dest="plot_path", default=None)


def check_bench(args: argparse.Namespace) -> None:
    """Everything the run needs, before the (long) run: the model found, sizes within its context, output paths
    writable, optional packages and binaries present, the device and its dtype support."""
    from ..device import Device
    from .llama_bench import check_binary
    from .model_bench import open_source

    args.dtype_name = DTYPES[args.dtype]
    args.source = open_source(args.model)  # CheckpointError for a missing checkpoint
    n_ctx = args.source.spec.n_ctx
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
    if args.llama_bench is not None:
        args.llama_bench_path = check_binary(args.llama_bench)
        if args.source.checkpoint is None:
            from .llama_bench import gguf_for

            gguf_for(args.source, args.dtype_name, Path("."))  # (the preset's one-line refusal)
        if args.batch > 1:
            raise UsageError("--llama-bench measures one sequence: use --batch 1 (llama-batched-bench measures "
                             "batches)")
    args.device_obj = Device.parse(args.device)
    if args.profile and args.device_obj.kind != "wgpu":
        raise UsageError(f"--profile times GPU kernels: it needs a WebGPU device, not {args.device_obj.describe()}")
    if args.dtype_name == "float16" and not args.device_obj.has_f16:
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
    args.load_before = _load_average()
    if args.processes > 1:
        return _run_processes(args)
    from tqdm.auto import tqdm

    from . import model_bench as mb

    device, source = args.device_obj, args.source
    prompts, decode = args.prompts, args.decode  # check_bench: both fit the context
    if args.cpu_threads:
        from ..backends import blas

        blas.set_threads(args.cpu_threads)
    n_ctx = min(source.spec.n_ctx, mb.context_needed(prompts, decode))
    model = mb.build_model(source, device, args.dtype_name, n_ctx)
    if args.kv_dtype != "auto":
        model.kv_dtype = args.kv_dtype
    vocab = model.vocab_size
    engines = 3 if args.compare else 1
    results = []
    notes: list[str] = []
    with tqdm(total=(len(prompts) + 1) * engines, desc="bench", file=sys.stderr) as bar:
        results.append(mb.bench_webtensor(model, prompts, decode, args.repeats, bar, args.profile, args.batch))
        if args.compare:
            if args.cpu_threads:
                import torch

                torch.set_num_threads(args.cpu_threads)
            hf = mb.hf_model(source, model, args.dtype_name)
            del model
            results.append(mb.bench_hf(hf, vocab, args.dtype, prompts, decode, args.repeats, bar, args.batch))
            ours = results[0].extra
            agree = mb.agreement(ours["greedy_tokens"], hf, ours["decode_prompts"], decode + 1)
            ours["tokens_agreeing_with_hf"] = agree
            notes.append(f"webtensor: its first {agree} of {decode + 1} greedy tokens are HF's")
            if args.dtype_name == "float16" and hf.device.type != "cuda":
                notes.append("torch step: float16 runs only on CUDA; not run")
                bar.update(len(prompts) + 1)
            else:
                results.append(mb.bench_torch_step(hf, vocab, args.dtype, prompts, decode, args.repeats, bar,
                                                args.batch))
                agree = results[-1].extra["tokens_agreeing_with_hf"]
                notes.append(f"torch step: its first {agree} of {decode + 1} greedy tokens are HF's")
            del hf
    report = _report(args, [r.as_dict() for r in results], notes)
    if args.llama_bench is not None:
        _add_llama_bench(args, report)
    return _finish(args, report)


def _report(args: argparse.Namespace, results: list[dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    s = args.source.spec
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.node(), "python": platform.python_version(),
        "command": "webtensor " + " ".join(sys.argv[1:]) if sys.argv else "", "model": args.model,
        "architecture": s.architecture, "weights": "random (preset)" if args.source.preset else "checkpoint",
        "dtype": args.dtype, "cpu_threads": args.cpu_threads or "default", "load_before": args.load_before,
        "load": _load_average(),
        "results": results, "notes": notes,
    }


def _load_average() -> list[float] | None:
    """The machine's 1, 5 and 15-minute load averages when the report is made (other work beside the bench)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _add_llama_bench(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """llama-bench on a GGUF of the same weights, its result appended to the report's."""
    from . import llama_bench

    with tempfile.TemporaryDirectory(prefix="webtensor-bench-") as tmp:
        gguf, how = llama_bench.gguf_for(args.source, args.dtype_name, Path(tmp))
        print(f"[bench] llama-bench on {gguf} ({how})", file=sys.stderr)
        results = llama_bench.run(args.llama_bench_path, gguf, args.prompts, args.decode, args.repeats,
                                  args.llama_bench_args, how)
    report["results"].extend(res.as_dict() for res in results)
    report["load_after_llama_bench"] = _load_average()


def _finish(args: argparse.Namespace, report: dict[str, Any]) -> int:
    """Ratios, the table (and the spread over processes), the JSON and the chart."""
    report.update(_all_ratios(report["results"]))
    print_table(report)
    if "spread" in report:
        print_spread(report)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot_path:
        plot(report, args.plot_path)
    return 0


def _child_argv(args: argparse.Namespace, json_path: str) -> list[str]:
    """`bench` arguments that run this measurement once, in one process, writing `json_path` (llama-bench runs
    once, in the parent)."""
    argv = ["bench", "--model", args.model, "--device", args.device, "--dtype", args.dtype, "--kv-dtype", args.kv_dtype,
            "--prompts", ",".join(map(str, args.prompts)), "--decode", str(args.decode), "--batch", str(args.batch),
            "--repeats", str(args.repeats), "--cpu-threads", str(args.cpu_threads), "--processes", "1",
            "--json", json_path]
    return argv + (["--compare"] if args.compare else []) + (["--profile"] if args.profile else [])


METRICS = ("ttft_ms", "decode_tok_s", "decode_ms_per_token")


def _run_processes(args: argparse.Namespace) -> int:
    """The measurement in `args.processes` fresh processes (`python -m webtensor.cli bench ...
    --processes 1`), one after the other: a figure counts only if it holds across processes. The
    report's `results` are the first process's with every figure replaced by the median over the
    processes; `spread` has [min, median, max] of each; `processes` every process's report. llama-bench
    then runs once (its own repetitions give its spread: `stddev` in its result's extra)."""
    import statistics
    import subprocess

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
    report = dict(reports[0], results=results, spread=spread, processes=reports, load_before=args.load_before,
                  load=_load_average(),
                  command="webtensor " + " ".join(sys.argv[1:]) if sys.argv else "")
    for key in [k for k in report if k.startswith("ratios_")]:
        del report[key]  # (each process's own; _finish makes the medians')
    if args.llama_bench is not None:
        _add_llama_bench(args, report)
    print(f"== median of {args.processes} processes")
    return _finish(args, report)


def print_spread(report: dict[str, Any]) -> None:
    n = len(report.get("processes", []))
    print(f"\nmin / median / max over {n} fresh processes:")
    for engine, sp in report.get("spread", {}).items():
        for name, (lo, mid, hi) in sp.items():
            if name.startswith("prefill_tok_s") or name == "decode_tok_s":
                label = "decode" if name == "decode_tok_s" else "prefill " + name.split("/")[1]
                print(f"  {engine:<18} {label:<14} "
                      f"{lo:>12,.1f} {mid:>12,.1f} {hi:>12,.1f} tok/s  (max / min {hi / lo:.2f})")


# the anchors webtensor's figures are divided by: report key -> (name printed, which result)
ANCHORS: dict[str, tuple[str, Callable[[str], bool]]] = {
    "ratios_webtensor_over_hf": ("hf", lambda e: e == "hf-transformers"),
    "ratios_webtensor_over_torch_step": ("torch step", lambda e: e.startswith("torch")),
    "ratios_webtensor_over_llama_cpp": ("llama.cpp", lambda e: e.startswith("llama.cpp")),
}


def _all_ratios(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """webtensor's figures over each anchor's that ran (results[0] is webtensor's); beside llama.cpp run at several
    thread counts, over each ("ratios_webtensor_over_llama_cpp_t2": its -t 2 result; the plain key: the first)."""
    out = {}
    for key, (_, is_anchor) in ANCHORS.items():
        others = [r for r in results[1:] if is_anchor(r["engine"])]
        if others:
            out[key] = _ratios(results[0], others[0])
        for other in others if len(others) > 1 else []:
            out[f"{key}_t{other['engine'].rsplit(' ', 1)[-1]}"] = _ratios(results[0], other)
    return out


def _ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """a / b for decode tok/s and each prefill length's tok/s (two results)."""
    return {"decode_tok_s": a["decode_tok_s"] / b["decode_tok_s"],
            **{f"prefill_{k}_tok_s": a["prefill_tok_s"][k] / b["prefill_tok_s"][k] for k in a["prefill_tok_s"]}}


def print_table(report: dict[str, Any]) -> None:
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
    for key in sorted(k for k in report if k.startswith("ratios_webtensor_over_")):
        anchor = ANCHORS[key][0] if key in ANCHORS else "llama.cpp -t " + key.rsplit("_t", 1)[-1]
        for k, v in report[key].items():
            print(f"ratio webtensor / {anchor}  {k}: {v:.2f}x")
    for note in report.get("notes", []):
        print(note)
    if report.get("load"):
        print("machine load (1 / 5 / 15 min averages) before / after: "
              + " / ".join(map(str, report.get("load_before") or [])) + "  ->  " + " / ".join(map(str, report["load"])))
    extra = rows[0].get("extra", {})
    for key, title in (("profile", "one decode step"), ("profile_prefill", "one prefill")):
        prof = extra.get(key)
        if prof:
            print(f"\nGPU time per kernel, {title} ({prof['dispatches']} dispatches, each timed alone):")
            for name, us in prof["kernels"]:
                print(f"  {name:40s} {us:9.1f} us")
            print(f"  {'total':40s} {prof['total_us']:9.1f} us")


def plot(report: dict[str, Any], path: str) -> None:
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
        ax.bar([r["engine"] for r in rows], vals, color=["#3465a4", "#cc7a00", "#4e9a06", "#75507b"][: len(rows)])
        ax.set_title(title)
        ax.tick_params(axis="x", labelsize=7)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom")
    fig.suptitle(f"{report['model']} {report['dtype']} on {rows[0]['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
