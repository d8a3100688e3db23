"""Measuring GPT-2 on a webtensor device: prefill tokens/s, time to first token, decode tokens/s,
dispatches / submits / readbacks per decode step, and device memory. Every figure is a median
over repeats after a warm-up run that is not counted. On a GPU each timed run starts right after
~0.3 s of GPU work (the engine's own device: `webtensor_gate`, `torch_gate`): an idle GPU lowers
its clock, and a prefill timed after host work would run at whatever clock the idling left
(issue 25: 4-5x on the H200; `backends.wgpu.profiler.keep_busy`)."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..device import Device
from ..errors import WebtensorError
from ..models.gpt2 import GPT2, GPT2Config
from ..models.loader import random_arrays
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


def bench_webtensor(model: GPT2, prompts: list[int], decode_tokens: int, repeats: int, progress: Any = None,
                    profile: bool = False, batch: int = 1) -> BenchResult:
    cfg, dev = model.config, model.device
    rng = np.random.default_rng(0)
    res = BenchResult("webtensor", dev.describe(), model.name, model.dtype or "as stored")

    def prefill(ids: list[int]) -> None:
        next(model.generate_ids(ids, 1, temperature=0.0, stop_at_eos=False))

    gate = webtensor_gate(dev)
    _prefill_table(res, prompts, lambda T: rng.integers(0, cfg.vocab_size, T).tolist(), prefill, repeats, progress,
                   gate)

    ids = rng.integers(0, cfg.vocab_size, 8).tolist()
    n = decode_tokens

    batch_ids = [rng.integers(0, cfg.vocab_size, 8).tolist() for _ in range(batch)]

    def decode() -> tuple[float, dict[str, int]]:
        if batch > 1:  # B sequences decoding together (generation.generate_batch)
            gen: Any = generate_batch(runner, batch_ids, n + 1)
        else:
            gen = model.generate_ids(ids, n + 1, temperature=0.0, stop_at_eos=False)
        next(gen)  # prefill + first token: not part of decode
        s0 = dev.stats()
        t0 = time.perf_counter()
        count = sum(1 for _ in gen)
        dt = time.perf_counter() - t0
        s1 = dev.stats()
        assert count == n
        return dt, {k: s1[k] - s0[k] for k in ("dispatches", "submits", "readbacks")}

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
    st = dev.stats()
    res.memory_mb = st.get("peak_bytes_in_use", 0) / 2**20
    if profile and dev.kind == "wgpu":
        from ..backends.wgpu.profiler import profile_decode_step, profile_prefill

        res.extra["profile"] = profile_decode_step(model, ids)
        res.extra["profile_prefill"] = profile_prefill(model, max(prompts))
    return res


def hf_model(cfg: GPT2Config, arrays: dict[str, np.ndarray], dtype: str) -> Any:
    """A Hugging Face `GPT2LMHeadModel` (eval mode) with the weights `arrays` (HF names, without
    "transformer.") and the config `cfg`, on CUDA if present, else the CPU; float16 for "float16",
    else float32 (int8 runs compare against the dequantized weights)."""
    import torch
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    hf_cfg = HFConfig(vocab_size=cfg.vocab_size, n_positions=cfg.n_positions, n_embd=cfg.n_embd,
                      n_layer=cfg.n_layer, n_head=cfg.n_head, n_inner=cfg.n_inner,
                      layer_norm_epsilon=cfg.layer_norm_epsilon, activation_function=cfg.activation_function,
                      scale_attn_weights=cfg.scale_attn_weights,
                      scale_attn_by_inverse_layer_idx=cfg.scale_attn_by_inverse_layer_idx,
                      reorder_and_upcast_attn=cfg.reorder_and_upcast_attn,
                      tie_word_embeddings=cfg.tie_word_embeddings)
    with torch.device(dev):  # its random init runs there (seconds for gpt2-xl on a GPU), then is overwritten
        model = GPT2LMHeadModel(hf_cfg).eval()
    sd = {("" if k == "lm_head.weight" else "transformer.") + k: torch.from_numpy(np.ascontiguousarray(v))
          for k, v in arrays.items()}
    if cfg.tie_word_embeddings:
        sd["lm_head.weight"] = sd["transformer.wte.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]  # buffers, not weights
    if missing or unexpected:
        raise WebtensorError(f"--compare: the HF model did not take the weights (missing {missing}, "
                             f"unexpected {unexpected})")
    return model.to(torch.float16 if dtype == "float16" else torch.float32)


def _torch_device(model: Any) -> tuple[str, Any]:
    """(description, synchronize) of the device a torch model is on; on CUDA it also resets the
    peak-memory counter, so each engine's memory figure is its own peak."""
    import torch

    dev = model.device.type
    name = torch.cuda.get_device_name() if dev == "cuda" else "CPU"
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    return f"torch {torch.__version__} {dev} ({name})", (torch.cuda.synchronize if dev == "cuda" else (lambda: None))


def bench_hf(model: Any, cfg: GPT2Config, dtype: str, prompts: list[int], decode_tokens: int,
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
        _prefill_table(res, prompts, lambda T: torch.tensor([rng.integers(0, cfg.vocab_size, T).tolist()], device=dev),
                       prefill, repeats, progress, gate)
        x = torch.tensor([rng.integers(0, cfg.vocab_size, 8).tolist() for _ in range(batch)], device=dev)  # (B, 8)
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
            model.generate(x, attention_mask=mask, max_new_tokens=n + 1, min_new_tokens=n + 1, do_sample=False,
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


def bench_torch_step(model: Any, cfg: GPT2Config, dtype: str, prompts: list[int], decode_tokens: int,
                     repeats: int, progress: Any = None, batch: int = 1) -> BenchResult:
    """The hand-written torch GPT-2 (`torch_step.TorchGPT2Step`) on the weights of the HF model
    `model`: static KV cache, SDPA, the decode step a CUDA graph on CUDA (eager on the CPU).
    Prefill: its own run of each prompt up to the first token; decode: the time from after the
    prefill's token to the n-th step's token read back (one readback), median over repeats."""
    import torch

    from .torch_step import TorchGPT2Step

    described, sync = _torch_device(model)
    cuda = model.device.type == "cuda"
    engine = "torch+cudagraph" if cuda else "torch-step (cpu)"
    res = BenchResult(engine, described + (", CUDA graph" if cuda else ", eager"), "", dtype)
    span = torch_step_span(cfg.n_positions, decode_tokens)
    one = TorchGPT2Step(model, span=span)
    rng = np.random.default_rng(0)  # the same prompts as the other engines

    def prefill(ids: list[int]) -> None:
        one.prefill(ids)
        one.tokens(len(ids))  # the first token, read back

    gate = torch_gate(model)
    _prefill_table(res, prompts, lambda T: rng.integers(0, cfg.vocab_size, T).tolist(), prefill, repeats, progress,
                   gate)
    rows = [rng.integers(0, cfg.vocab_size, 8).tolist() for _ in range(batch)]
    step = one if batch == 1 else TorchGPT2Step(model, span=span, batch=batch)
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
    res.extra["tokens_agreeing_with_hf"] = _agreement(step.tokens(8), model, rows, n + 1)
    res.extra["attention_span"] = span
    res.extra["cuda_graph"] = step.graph is not None
    if cuda:
        res.memory_mb = torch.cuda.max_memory_allocated() / 2**20
    return res


def _agreement(got: list[list[int]], model: Any, rows: list[list[int]], n: int) -> int:
    """How many leading tokens of `got` (each row's n greedy tokens after `rows`) HF's greedy
    `generate` gives too, the fewest over the rows: a check that the anchor computes HF's model."""
    import torch

    with torch.inference_mode():
        x = torch.tensor(rows, device=model.device)  # (B, T)
        want = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0)[:, x.shape[1]:].tolist()
    return min(next((i for i, (a, b) in enumerate(zip(g, w, strict=True)) if a != b), n)
               for g, w in zip(got, want, strict=True))


def build_model(spec: str, device: Device, dtype: str, seed: int = 0) -> tuple[GPT2, dict[str, np.ndarray] | None]:
    """A preset name (random weights) or a checkpoint directory / HF id."""
    from ..models.gpt2.config import PRESETS

    if spec.split("/")[-1] in PRESETS:
        cfg = GPT2Config.preset(spec)
        arrays = random_arrays("gpt2", cfg, seed)
        model = GPT2.from_arrays(cfg, arrays, device, dtype, None, name=f"{spec} (random weights)")
        return model, (None if model.quant else arrays)  # (int8: HF gets the dequantized weights)
    return GPT2.from_pretrained(spec, device=device, dtype=dtype), None
