"""llama.cpp beside webtensor (`webtensor bench --llama-bench PATH`): its own `llama-bench` binary run on a GGUF file
of the same weights, its JSON report (`-o json`) read into the bench's figures.

Which file: the .gguf given as `--model` where webtensor runs its tensors as stored (dtype auto; q8_0 keeps a
file's quantized tensors too); otherwise one written for the run by `formats.gguf_writer.write_gguf` from the
same source in the bench's dtype (float32 -> F32, float16 -> F16, q8_0 -> Q8_0; auto: F16 where the checkpoint's
matrices are float16, else F32). A preset (random weights, no tokenizer) has no GGUF llama.cpp would load.

What llama-bench measures: `-p N` a prompt of N tokens processed at once (pp, tokens/s), `-n N` N tokens generated
one at a time from an empty context (tg, tokens/s), each `-r` times after a warm-up, on every backend the binary
was built with (CUDA offloads all layers by default). webtensor's prefill also samples the first token and its
decode follows an 8-token prompt: the same work to within one token.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

from ..errors import UsageError, WebtensorError
from .model_bench import BenchResult, Source

OUTTYPES = {"float32": "f32", "float16": "f16", "q8_0": "q8_0"}
TIMEOUT_S = 3600


def check_binary(path: str) -> Path:
    """The llama-bench executable at `path`; UsageError where there is none."""
    p = Path(path)
    if not p.is_file() or not os.access(p, os.X_OK):
        raise UsageError(f"--llama-bench {path}: not an executable file (build it with "
                         "../shared/tools/llamacpp-build, which prints where llama-bench lands)")
    return p


def gguf_for(source: Source, dtype: str | None, folder: Path) -> tuple[Path, str]:
    """(the GGUF file llama-bench runs, how it came to be) for `source` in the bench's `dtype`; a written file goes
    into `folder`."""
    ck = source.checkpoint
    if ck is None:
        raise UsageError(f"--llama-bench: {source.name!r} is a preset (random weights, no tokenizer): llama.cpp "
                         "needs a GGUF file with a vocabulary; give a checkpoint directory or a .gguf file "
                         "(tools/random_checkpoint.py writes a random one of any preset's shape)")
    if ck.gguf and dtype in (None, "q8_0"):
        return Path(ck.where), "the file given"
    from ..formats.gguf_writer import write_gguf

    outtype = OUTTYPES.get(dtype or "") or ("f16" if _stored_f16(source) else "f32")
    out = folder / f"{Path(ck.where).stem}.{outtype}.gguf"
    return write_gguf(ck.where, out, outtype), f"written by webtensor's gguf_writer ({outtype})"


def _stored_f16(source: Source) -> bool:
    ck = source.checkpoint
    specs = ck.family.tensors(ck.config)  # type: ignore[union-attr]
    return any(ck.stored_type(n) == "F16" for n, s in specs.items() if s.kind != "float32")  # type: ignore[union-attr]


def command(binary: Path, gguf: Path, prompts: list[int], decode: int, repeats: int, extra: str) -> list[str]:
    """llama-bench's command line: every prompt length, one decode length, `repeats` repetitions, JSON out."""
    return [str(binary), "-m", str(gguf), "-p", ",".join(map(str, prompts)), "-n", str(decode),
            "-r", str(repeats), "-o", "json", *shlex.split(extra)]


def run(binary: Path, gguf: Path, prompts: list[int], decode: int, repeats: int, extra: str = "",
        how: str = "") -> list[BenchResult]:
    """Run llama-bench and read its report: one "llama.cpp" result, or one per thread count where `extra` asks
    for several (`-t 1,2`: "llama.cpp -t 1", "llama.cpp -t 2")."""
    cmd = command(binary, gguf, prompts, decode, repeats, extra)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise WebtensorError(f"llama-bench did not run: {e}") from e
    if r.returncode != 0:
        tail = " / ".join(r.stderr.strip().splitlines()[-3:])
        raise WebtensorError(f"llama-bench failed (exit {r.returncode}): {tail}")
    results = parse(r.stdout, prompts)
    for res in results:
        res.extra["command"] = shlex.join(cmd)
        res.extra["gguf"] = how
    return results


def parse(text: str, prompts: list[int]) -> list[BenchResult]:
    """llama-bench's `-o json` output (a list of tests: n_prompt, n_gen, n_threads, avg_ts, stddev_ts, ...) as the
    bench's figures, a result per thread count: each pp test a prefill length, the tg test the decode."""
    try:
        tests = json.loads(text)
    except json.JSONDecodeError as e:
        raise WebtensorError(f"llama-bench's output is not JSON ({e}): {text[:200]!r}") from e
    if not isinstance(tests, list) or not tests or not all(isinstance(t, dict) for t in tests):
        raise WebtensorError(f"llama-bench's output is not a list of tests: {text[:200]!r}")
    groups: dict[Any, list[dict[str, Any]]] = {}
    for t in tests:
        groups.setdefault(t.get("n_threads"), []).append(t)
    out = [_result(group, prompts) for group in groups.values()]
    if len(out) > 1:
        for res, threads in zip(out, groups, strict=True):
            res.engine = f"llama.cpp -t {threads}"
    return out


def _result(tests: list[dict[str, Any]], prompts: list[int]) -> BenchResult:
    """One configuration's tests as a BenchResult."""
    first = tests[0]
    backends = first.get("backends", "?")
    device = f"llama.cpp {first.get('build_commit', '?')} ({backends}, {first.get('n_threads', '?')} threads"
    gpu = first.get("gpu_info") or ""
    device += f", {gpu})" if gpu else f", {first.get('cpu_info', 'CPU')})"
    res = BenchResult("llama.cpp", device, first.get("model_filename", ""), first.get("model_type", ""))
    spread: dict[str, float] = {}
    for t in tests:
        n_prompt, n_gen, ts = int(t.get("n_prompt", 0)), int(t.get("n_gen", 0)), float(t["avg_ts"])
        if n_prompt and not n_gen:
            res.prefill_tok_s[str(n_prompt)] = ts
            res.prefill_ms[str(n_prompt)] = n_prompt / ts * 1e3
            spread[f"prefill_{n_prompt}_stddev_tok_s"] = float(t.get("stddev_ts", 0.0))
        elif n_gen and not n_prompt:
            res.decode_tok_s, res.decode_tokens = ts, n_gen
            res.decode_ms_per_token = 1e3 / ts
            spread["decode_stddev_tok_s"] = float(t.get("stddev_ts", 0.0))
    missing = [str(p) for p in prompts if str(p) not in res.prefill_tok_s] + (["tg"] if not res.decode_tok_s else [])
    if missing:
        raise WebtensorError(f"llama-bench's report lacks the tests {', '.join(missing)}")
    res.prefill_tok_s = {str(p): res.prefill_tok_s[str(p)] for p in prompts}  # (the bench's order)
    res.prefill_ms = {str(p): res.prefill_ms[str(p)] for p in prompts}
    res.ttft_ms = res.prefill_ms[str(prompts[0])]
    res.extra.update(spread)
    res.extra.update({k: first.get(k) for k in ("n_threads", "backends", "n_batch", "n_ubatch", "flash_attn",
                                                "model_type", "model_size", "model_n_params", "build_commit",
                                                "cpu_info", "gpu_info") if k in first})
    res.extra["batch"] = 1
    res.extra["decode_tok_s_per_sequence"] = res.decode_tok_s
    res.extra["decode_from_empty_context"] = True
    return res
