"""Measuring a language model of any family on a webtensor device: prefill tokens/s, time to first token, decode
tokens/s, dispatches / submits / readbacks per decode step, and device memory; and, on the same weights, the
anchors `--compare` runs (HF transformers, the hand-written torch step). Every figure is a median over repeats
after a warm-up run that is not counted. On a GPU each timed run starts right after ~0.3 s of GPU work (the
engine's own device: `webtensor_gate`, `torch_gate`): an idle GPU lowers its clock, and a prefill timed after host
work would run at whatever clock the idling left (issue 25: 4-5x on the H200; `backends.wgpu.profiler.keep_busy`).

What `--model` names (`open_source`): a checkpoint the loader reads (a directory, a .gguf file, an id in the local
Hugging Face cache) or a preset name of any family (`models.registry.presets`: random weights of a published
model's shape). Nothing here names a family."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..device import Device
from ..errors import WebtensorError
from ..models import loader, registry
from ..runtime.generate import generate_batch


@dataclass
class BenchResult:
    engine: str
    device: str
    model: str
    dtype: str
    prefill_tok_s: dict[str, float] = field(default_factory=dict)  # prompt length -> tokens/s
    prefill_ms: dict[str, float] = field(default_factory=dict)
    ttft_ms: float = 0.0
    decode_tok_s: float = 0.0
    decode_ms_per_token: float = 0.0
    decode_tokens: int = 0
    per_step: dict[str, float] = field(default_factory=dict)  # dispatches / submits / readbacks per step
    memory_mb: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _median_time(fn: Any, repeats: int, gate: Any = None) -> float:
    """Median seconds of fn() over `repeats` calls after a warm-up call; `gate()` runs before each."""
    gate = gate or (lambda: None)
    gate()
    fn()  # warm-up, not counted
    times = []
    for _ in range(repeats):
        gate()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def webtensor_gate(dev: Device) -> Any:
    """Before a timed run on a GPU: ~0.3 s of work on it, waited for (a no-op elsewhere)."""
    if dev.kind != "wgpu" or dev.ctx.info.is_software:
        return lambda: None
    from ..backends.wgpu.profiler import keep_busy

    return lambda: keep_busy(dev)


def torch_gate(model: Any) -> Any:
    """`webtensor_gate` for a torch model on CUDA: ~0.3 s of 2048-wide products, synchronized."""
    import torch

    if model.device.type != "cuda":
        return lambda: None
    from ..backends.wgpu.profiler import GATE_SECONDS

    x = torch.randn(2048, 2048, device=model.device) * 0.02

    def gate() -> None:
        t_end = time.perf_counter() + GATE_SECONDS
        while time.perf_counter() < t_end:
            for _ in range(8):
                x @ x
            torch.cuda.synchronize()

    return gate


def _prefill_table(res: BenchResult, prompts: list[int], make_prompt: Any, prefill: Any, repeats: int,
                   progress: Any, gate: Any = None) -> None:
    """Median time of `prefill(prompt)` for each prompt length; TTFT is the first length's."""
    for T in prompts:
        x = make_prompt(T)
        sec = _median_time(lambda x=x: prefill(x), repeats, gate)
        res.prefill_ms[str(T)] = sec * 1e3
        res.prefill_tok_s[str(T)] = T / sec
        if progress:
            progress.update(1)
    res.ttft_ms = res.prefill_ms[str(prompts[0])]


def bench_webtensor(model: Any, prompts: list[int], decode_tokens: int, repeats: int, progress: Any = None,
                    profile: bool = False, batch: int = 1) -> BenchResult:
    """A `LanguageModel`: prefill by `generate_ids(prompt, 1)` (the prompt and its first token), decode by greedy
    `generate_ids` (one sequence) or `generate_batch` (`batch` sequences) after an 8-token prompt."""
    V, dev = model.vocab_size, model.device
    rng = np.random.default_rng(0)
    res = BenchResult("webtensor", dev.describe(), model.name,
                      f"{model.dtype or 'auto'}: {'+'.join(weight_types(model))}")

    def prefill(ids: list[int]) -> None:
        next(model.generate_ids(ids, 1, temperature=0.0, stop_at_eos=False))

    gate = webtensor_gate(dev)
    _prefill_table(res, prompts, lambda T: rng.integers(0, V, T).tolist(), prefill, repeats, progress, gate)

    ids = rng.integers(0, V, 8).tolist()
    n = decode_tokens

    batch_ids = [rng.integers(0, V, 8).tolist() for _ in range(batch)]

    def decode() -> tuple[float, dict[str, int]]:
        if runner is not None:  # B > 1 sequences decoding together (runtime.generate.generate_batch): a column a step
            gen: Any = generate_batch(runner, batch_ids, n + 1)
        else:
            gen = ([t] for t in model.generate_ids(ids, n + 1, temperature=0.0, stop_at_eos=False))
        tokens[:] = [next(gen)]  # prefill + first token: not part of decode
        s0 = dev.stats()
        t0 = time.perf_counter()
        tokens.extend(gen)
        dt = time.perf_counter() - t0
        s1 = dev.stats()
        assert len(tokens) == n + 1
        return dt, {k: s1[k] - s0[k] for k in ("dispatches", "submits", "readbacks")}

    tokens: list[list[int]] = []  # the last decode's tokens, a column (one per row) a step

    runner = model.runner(batch, invariant=False) if batch > 1 else None
    gate()
    decode()  # warm-up
    runs = []
    for _ in range(repeats):
        gate()
        runs.append(decode())
    if progress:
        progress.update(1)
    dt = statistics.median(r[0] for r in runs)
    res.decode_tokens = n
    res.decode_tok_s = batch * n / dt  # aggregate over the batch's rows
    res.decode_ms_per_token = dt / n * 1e3  # per step
    res.per_step = {k: v / n for k, v in runs[-1][1].items()}
    res.extra["batch"] = batch
    res.extra["decode_tok_s_per_sequence"] = n / dt
    res.extra["decode_prompts"] = batch_ids if batch > 1 else [ids]  # each row's prompt and greedy tokens
    res.extra["greedy_tokens"] = [list(row) for row in zip(*tokens, strict=True)]
    st = dev.stats()
    res.memory_mb = st.get("peak_bytes_in_use", 0) / 2**20
    if profile and dev.kind == "wgpu":
        from ..backends.wgpu.profiler import profile_decode_step, profile_prefill

        res.extra["profile"] = profile_decode_step(model, ids)
        res.extra["profile_prefill"] = profile_prefill(model, max(prompts))
    return res


def hf_model(source: Source, model: Any, dtype: str | None) -> Any:
    """HF transformers' `AutoModelForCausalLM` (eval mode) on the weights `model` runs, on CUDA if present, else the
    CPU; float16 for "float16", else float32 (quantized weights dequantized). From the checkpoint itself where
    transformers reads it (a directory; a GGUF file through transformers' own GGUF reader, `gguf_file=`); for a
    preset, the preset's config.json with the model's weights read back (`loader.export_arrays`); and wherever
    webtensor rounded the weights at load (dtype q8_0), those rounded weights."""
    import torch
    import transformers

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tdtype = torch.float16 if dtype == "float16" else torch.float32
    if source.preset is not None:
        raw = dict(source.preset[2])
        cfg = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
        with torch.device(dev):  # its random init runs there (seconds for gpt2-xl on a GPU), then is overwritten
            # (transformers leaves from_config unannotated)
            hf = transformers.AutoModelForCausalLM.from_config(cfg)  # type: ignore[no-untyped-call]
        _load_arrays(hf, model)
    else:
        ck = source.checkpoint
        assert ck is not None  # (a Source is a preset or a checkpoint)
        path = Path(ck.where)
        kw: dict[str, Any] = dict(dtype=tdtype, device_map=dev)
        if ck.gguf:
            hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kw)
        else:
            hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), **kw)
        if model.dtype == "q8_0":
            _load_arrays(hf, model)
    return hf.to(dev, tdtype).eval()


def _load_arrays(hf: Any, model: Any) -> None:
    """The webtensor model's weights (`loader.export_arrays`) into the HF model, every one of them."""
    import torch

    arrays = loader.export_arrays(model)
    sd, used = {}, set()
    for key, t in hf.state_dict().items():
        name = model.family.canonical(key)
        if name in arrays:
            sd[key] = torch.from_numpy(arrays[name]).to(t.dtype)
            used.add(name)
    missing = sorted(set(arrays) - used)
    if missing:
        raise WebtensorError(f"--compare: the HF model has no place for {', '.join(missing[:3])}")
    hf.load_state_dict(sd, strict=False)
    if hf.config.tie_word_embeddings:
        hf.tie_weights()


def _torch_device(model: Any) -> tuple[str, Any]:
    """(description, synchronize) of the device a torch model is on; on CUDA it also resets the
    peak-memory counter, so each engine's memory figure is its own peak."""
    import torch

    dev = model.device.type
    name = torch.cuda.get_device_name() if dev == "cuda" else "CPU"
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    return f"torch {torch.__version__} {dev} ({name})", (torch.cuda.synchronize if dev == "cuda" else (lambda: None))


def bench_hf(model: Any, vocab_size: int, dtype: str, prompts: list[int], decode_tokens: int,
             repeats: int, progress: Any = None, batch: int = 1) -> BenchResult:
    """Hugging Face transformers (`hf_model`): prefill by `model(x)`, decode by `model.generate`."""
    import torch

    described, sync = _torch_device(model)
    dev = model.device
    res = BenchResult("hf-transformers", described, "", dtype)
    rng = np.random.default_rng(0)
    with torch.inference_mode():
        def prefill(x: Any) -> None:
            model(x).logits[:, -1].argmax(-1).item()
            sync()

        gate = torch_gate(model)
        _prefill_table(res, prompts, lambda T: torch.tensor([rng.integers(0, vocab_size, T).tolist()], device=dev),
                       prefill, repeats, progress, gate)
        x = torch.tensor([rng.integers(0, vocab_size, 8).tolist() for _ in range(batch)], device=dev)  # (B, 8)
        mask = torch.ones_like(x)
        n = decode_tokens

        from transformers import LogitsProcessor, LogitsProcessorList

        class StepClock(LogitsProcessor):
            """Timestamps each generated token (called after every forward, before the choice)."""

            def __init__(self) -> None:
                self.times: list[float] = []

            def __call__(self, input_ids: Any, scores: Any) -> Any:
                sync()
                self.times.append(time.perf_counter())
                return scores

        def decode_time() -> float:
            clock = StepClock()
            model.generate(x, attention_mask=mask, max_new_tokens=n + 1, eos_token_id=None, do_sample=False,
                           pad_token_id=0, logits_processor=LogitsProcessorList([clock]))
            return clock.times[-1] - clock.times[0]  # the n decode steps after the prefill's token

        gate()
        decode_time()  # warm-up
        dt = statistics.median(_gated(decode_time, gate) for _ in range(repeats))
        if progress:
            progress.update(1)
    _decode_figures(res, n, dt, batch)
    if dev.type == "cuda":
        res.memory_mb = torch.cuda.max_memory_allocated() / 2**20
    return res


def _gated(fn: Any, gate: Any) -> Any:
    gate()
    return fn()


def _decode_figures(res: BenchResult, n: int, dt: float, batch: int) -> None:
    res.decode_tokens = n
    res.decode_tok_s = batch * n / dt  # aggregate over the batch's rows
    res.decode_ms_per_token = dt / n * 1e3  # per step
    res.extra["batch"] = batch
    res.extra["decode_tok_s_per_sequence"] = n / dt


def torch_step_span(n_ctx: int, decode_tokens: int) -> int:
    """The cache positions the torch step's decode attends over: the 8-token prompt plus the decode,
    rounded up to 64 (as gpt-fast sizes its static cache to the generation), at most n_ctx."""
    return min(n_ctx, -(-(8 + decode_tokens) // 64) * 64)


def bench_torch_step(model: Any, vocab_size: int, dtype: str, prompts: list[int], decode_tokens: int,
                     repeats: int, progress: Any = None, batch: int = 1) -> BenchResult:
    """The hand-written torch step of the HF model's architecture (`torch_step.torch_step_for`) on its weights:
    static KV cache, SDPA, the decode step a CUDA graph on CUDA (eager on the CPU). Prefill: its own run of each
    prompt up to the first token; decode: the time from after the prefill's token to the n-th step's token read
    back (one readback), median over repeats."""
    import torch

    from .torch_step import torch_step_for

    described, sync = _torch_device(model)
    cuda = model.device.type == "cuda"
    engine = "torch+cudagraph" if cuda else "torch-step (cpu)"
    res = BenchResult(engine, described + (", CUDA graph" if cuda else ", eager"), "", dtype)
    n_ctx = context_needed(prompts, decode_tokens)
    span = torch_step_span(n_ctx, decode_tokens)
    one = torch_step_for(model, span=span, n_ctx=n_ctx)
    rng = np.random.default_rng(0)  # the same prompts as the other engines

    def prefill(ids: list[int]) -> None:
        one.prefill(ids)
        one.tokens(len(ids))  # the first token, read back

    gate = torch_gate(model)
    _prefill_table(res, prompts, lambda T: rng.integers(0, vocab_size, T).tolist(), prefill, repeats, progress, gate)
    rows = [rng.integers(0, vocab_size, 8).tolist() for _ in range(batch)]
    if batch > 1:
        del one
        torch.cuda.empty_cache() if cuda else None
    step = one if batch == 1 else torch_step_for(model, span=span, batch=batch, n_ctx=n_ctx)
    n = decode_tokens

    def decode_time() -> float:
        step.prefill(rows)
        step.tokens(8)  # prefill + first token: not part of decode
        t0 = time.perf_counter()
        for _ in range(n):
            step.step()
        got = step.tokens(9)  # the n decode tokens: one readback (synchronizes)
        dt = time.perf_counter() - t0
        assert len(got[0]) == n
        return dt

    gate()
    decode_time()  # warm-up
    dt = statistics.median(_gated(decode_time, gate) for _ in range(repeats))
    sync()
    if progress:
        progress.update(1)
    _decode_figures(res, n, dt, batch)
    res.extra["tokens_agreeing_with_hf"] = agreement(step.tokens(8), model, rows, n + 1)
    res.extra["attention_span"] = span
    res.extra["cuda_graph"] = step.graph is not None
    if cuda:
        res.memory_mb = torch.cuda.max_memory_allocated() / 2**20
    return res


def agreement(got: list[list[int]], model: Any, rows: list[list[int]], n: int) -> int:
    """How many leading tokens of `got` (each row's n greedy tokens after `rows`) HF's greedy `generate` gives too
    (never stopping at an EOS), the fewest over the rows: a check that an engine computes HF's model."""
    import torch

    with torch.inference_mode():
        x = torch.tensor(rows, device=model.device)  # (B, T)
        want = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, eos_token_id=None,
                              do_sample=False, pad_token_id=0)[:, x.shape[1]:].tolist()
    return min(next((i for i, (a, b) in enumerate(zip(g, w, strict=True)) if a != b), n)
               for g, w in zip(got, want, strict=True))


def context_needed(prompts: list[int], decode_tokens: int) -> int:
    """Positions a sequence needs: the longest prompt and its first token, or an 8-token prompt and the decode."""
    return max(max(prompts) + 1, 8 + decode_tokens + 1)


@dataclass
class Source:
    """What `--model` names: a preset (family, config, config.json dict) or an opened checkpoint."""

    name: str
    preset: tuple[Any, Any, dict[str, Any]] | None = None
    checkpoint: loader.Checkpoint | None = None

    @property
    def spec(self) -> Any:
        if self.preset is not None:
            return self.preset[1].spec
        assert self.checkpoint is not None  # (a Source is a preset or a checkpoint)
        return self.checkpoint.config.spec

    @property
    def is_gguf(self) -> bool:
        return self.checkpoint is not None and self.checkpoint.gguf


def open_source(name: str) -> Source:
    """A path (a directory or a .gguf file) or an HF cache id is a checkpoint; otherwise a preset name of any family
    is random weights of that shape. CheckpointError for neither."""
    if not Path(name).exists():
        found = registry.preset(name)
        if found is not None:
            return Source(name, preset=found)
    try:
        return Source(name, checkpoint=loader.open_checkpoint(name))
    except WebtensorError as e:
        if Path(name).exists() or "/" in name:
            raise
        raise type(e)(f"{e} (nor is {name!r} a preset: {', '.join(registry.presets())})") from e


def build_model(source: Source, device: Device, dtype: str | None, n_ctx: int | None = None, seed: int = 0) -> Any:
    """The `LanguageModel` of `source` on `device` (dtype as `loader.check_dtype` reads it; None: as stored), with
    a context of n_ctx positions (default: the model's, at most loader.DEFAULT_CTX)."""
    if source.preset is not None:
        family, cfg, _ = source.preset
        ck = loader.from_arrays(family, cfg, loader.random_arrays(family, cfg, seed),
                                name=f"{source.name} (random weights)")
        return loader.build(ck, device, dtype, n_ctx, progress=False)
    return loader.build(source.checkpoint, device, dtype, n_ctx)  # type: ignore[arg-type]


def weight_types(model: Any) -> list[str]:
    """The types the model's matrices and embeddings are held in ("Q4_1", "Q8_0", "float16", ...), sorted."""
    kinds = model.family.tensors(model.config)
    first = {fused: parts[0] for fused, parts in model.family.fusions(model.config)}
    held = set()
    for name, t in model.params.items():
        spec = kinds.get(first.get(name, name))
        if spec is not None and spec.kind != "float32":
            held.add(getattr(t, "qtype", None) or t.dtype.name)
    return sorted(held)
