"""GPT-2 generation without numpy: the browser's driver for webtensor's GPT-2.

It runs the same forward pass as `webtensor.models.gpt2.model.GPT2` (embedding + positions, per
block layer norm -> fused QKV linear -> KV-cache rows -> causal attention -> fused projection with
residual -> layer norm -> fused linear + activation -> fused linear with residual, then the final layer
norm and the LM head, wte when tied), through `webtensor.ops` on a WebGPU device, but loads the checkpoint
with the pure-Python safetensors reader, tokenizes with the pure-Python BPE where `tokenizers` is
missing, and generates with `webtensor.generation` (the native model's loop) and
`models.gpt2.sampling.sample`'s pure-Python path (one sampler for every path, so a seed gives the
native model's tokens): nothing here imports numpy.

Natively it runs too (on wgpu-py), which is how its tokens are checked against `GPT2.generate`
without a browser.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import dtypes as dt
from .. import generation
from ..device import Device
from ..errors import CheckpointError
from ..formats.safetensors_pure import SafetensorsFile
from ..models.gpt2.forward import GPT2Weights
from ..tensor import Tensor, from_buffer


def _gpt2_module(name: str) -> Any:
    """`webtensor.models.gpt2.<name>` (config, tokenizer, weights): numpy-free modules (the package
    imports its numpy model lazily)."""
    return importlib.import_module(f"webtensor.models.gpt2.{name}")


def _stored_float32(where: dict[str, tuple[SafetensorsFile, str]], name: str) -> memoryview:
    sf, key = where[name]
    return sf.float32(key)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0  # prompt pass + first token
    decode_s: float = 0.0  # the tokens after the first
    seed: int | None = None  # the seed sampling used (drawn fresh when none was given); None when greedy
    token_ids: list[int] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: tokens after the first, per second (0 when there are none)."""
        n = self.new_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(prompt_tokens=self.prompt_tokens, new_tokens=self.new_tokens, prefill_s=self.prefill_s,
                    decode_s=self.decode_s, tokens_per_s=self.tokens_per_s, seed=self.seed,
                    token_ids=list(self.token_ids))


class WebGPT2(GPT2Weights):
    """GPT-2 weights on a WebGPU device (`GPT2Weights`: the same forward as the native model), a
    numpy-free loader, and generation through `webtensor.generation`."""

    def __init__(self, cfg: Any, params: dict[str, Tensor], device: Device, tokenizer: Any = None):
        super().__init__(cfg, params, device)
        self.tokenizer = tokenizer
        self._workspaces = generation.WorkspacePool()
        self.last_stats = GenerationStats()

    # -- loading --------------------------------------------------------------------------------
    @classmethod
    def load(cls, model_dir: str | Path, device: Device,
             progress: Callable[[str, int, int], None] | None = None) -> WebGPT2:
        """Load config.json, model.safetensors and the tokenizer from `model_dir` onto `device`.
        `progress(name, done_bytes, total_bytes)` is called after each tensor is uploaded."""
        d = Path(model_dir)
        config, tokenizer_mod, weights = (_gpt2_module(m) for m in ("config", "tokenizer", "weights"))
        cfg = config.GPT2Config.from_file(d / "config.json")
        tok = tokenizer_mod.GPT2Tokenizer.from_dir(d)
        weights.check_tokenizer(cfg, tok.vocab_size, d)
        files = sorted(d.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{d} has no model.safetensors")
        where: dict[str, tuple[SafetensorsFile, str]] = {}
        for f in files:
            try:
                sf = SafetensorsFile.from_path(f)  # a bad file: CheckpointError saying what is wrong
            except OSError as e:
                raise CheckpointError(f"{f} could not be read: {e}") from e
            for key in sf.keys():
                weights.add_tensor(where, key, (sf, key), f)
        weights.check_shapes({n: tuple(sf.info(k).shape) for n, (sf, k) in where.items()}, cfg, d)
        if cfg.tie_word_embeddings and "lm_head.weight" in where:
            same = bytes(_stored_float32(where, "lm_head.weight")) == bytes(_stored_float32(where, "wte.weight"))
            weights.check_tied_head(same, d)
        shapes = weights.expected_shapes(cfg)
        total = sum(math.prod(s) * 4 for s in shapes.values())
        done = 0
        params: dict[str, Tensor] = {}
        for name, shape in shapes.items():
            t = from_buffer(_stored_float32(where, name), shape, dt.float32, device)
            if len(shape) == 2 and name.startswith("h.") and device.backend.kmajor_weights:  # as the native model
                t = t.T.contiguous().T
            params[name] = t
            done += math.prod(shape) * 4
            if progress is not None:
                progress(name, done, total)
        return cls(cfg, params, device, tok)

    # -- generation -----------------------------------------------------------------------------
    def generate_ids(self, ids: Sequence[int], max_new_tokens: int = 32, temperature: float = 0.0,
                     top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                     stop_at_eos: bool = True, truncate_prompt: bool = False) -> Iterator[int]:
        """Yield new token ids one by one, as `GPT2.generate_ids` does (the same checks and
        messages, the same loop in `webtensor.generation`, the same sampler: one seed, one text)."""
        validate, sampling = _gpt2_module("validate"), _gpt2_module("sampling")
        params = sampling.with_seed(sampling.SamplingParams(temperature, top_k, top_p, seed))
        n_new = validate.check_max_new_tokens(max_new_tokens)
        ids = validate.fit_context(validate.check_ids(ids, self.config.vocab_size), n_new, self.config.n_positions,
                                   truncate_prompt)
        eos = self.config.eos_ids if stop_at_eos else frozenset()
        stats = self.last_stats = GenerationStats(prompt_tokens=len(ids), seed=params.seed)
        cfg = self.config
        ws = self._workspaces.acquire(lambda: generation.Workspace(self, generation.KVCache(
            cfg.n_layer, 1, cfg.n_positions, cfg.n_head, cfg.head_dim, self.device)))
        t0 = time.perf_counter()
        try:
            for tok in generation.generate(self, ws, ids, n_new, params.greedy,
                                           lambda row, p: sampling.sample(row, params, p), eos):
                now = time.perf_counter()
                if stats.new_tokens == 0:
                    stats.prefill_s = now - t0
                else:
                    stats.decode_s = now - t0 - stats.prefill_s
                stats.new_tokens += 1
                stats.token_ids.append(tok)
                yield tok
        finally:
            self._workspaces.release(ws)

    def generate(self, ids: Sequence[int], max_new_tokens: int = 32, **kw: Any) -> list[int]:
        return list(self.generate_ids(ids, max_new_tokens, **kw))

    def stream(self, prompt: str, max_new_tokens: int = 50, **kw: Any) -> Iterator[str]:
        """Generated text, piece by piece, as soon as it forms whole UTF-8 characters."""
        tok = self.tokenizer
        ids = tok.encode(_gpt2_module("validate").check_text(prompt))
        yield from _gpt2_module("tokenizer").stream_text(self.generate_ids(ids, max_new_tokens, **kw), tok.token_bytes)

