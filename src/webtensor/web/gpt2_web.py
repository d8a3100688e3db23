"""GPT-2 generation without numpy: the browser's driver for webtensor's GPT-2.

It runs the same forward pass as `webtensor.models.gpt2.model.GPT2` (embedding + positions, per
block layer norm -> fused QKV linear -> KV-cache rows -> causal attention -> fused projection with
residual -> layer norm -> fused linear + activation -> fused linear with residual, then the final layer
norm and the LM head, wte when tied), through `webtensor.ops` on a WebGPU device, but loads the checkpoint
with the pure-Python safetensors reader, tokenizes with the pure-Python BPE where `tokenizers` is
missing, and samples with the standard library (`random`): nothing here imports numpy.

Natively it runs too (on wgpu-py), which is how its tokens are checked against `GPT2.generate`
without a browser.
"""

from __future__ import annotations

import array
import importlib
import math
import random
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import dtypes as dt
from .. import ops
from ..device import Device
from ..errors import CheckpointError, ContextLengthError, SamplingError
from ..formats.safetensors_pure import SafetensorsFile
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
    token_ids: list[int] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: tokens after the first, per second (0 when there are none)."""
        n = self.new_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(prompt_tokens=self.prompt_tokens, new_tokens=self.new_tokens, prefill_s=self.prefill_s,
                    decode_s=self.decode_s, tokens_per_s=self.tokens_per_s, token_ids=list(self.token_ids))


class WebGPT2:
    """GPT-2 weights on a WebGPU device, and numpy-free KV-cached generation."""

    def __init__(self, cfg: Any, params: dict[str, Tensor], device: Device, tokenizer: Any = None):
        self.config, self.device, self.tokenizer = cfg, device, tokenizer
        self.wte, self.wpe = params["wte.weight"], params["wpe.weight"]
        self.lm_head = params.get("lm_head.weight", self.wte)  # (V, C); wte itself when tied
        self.ln_f = (params["ln_f.weight"], params["ln_f.bias"])
        fwd = _gpt2_module("forward")
        self.blocks = [fwd.Block(*(params[f"h.{i}.{n}"] for n in fwd.BLOCK_PARAMS)) for i in range(cfg.n_layer)]
        self._graph: Any = None  # (KV cache, DecodeGraph), built on the first greedy generation
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
            if len(shape) == 2 and name.startswith("h."):  # k-major storage (a GPU transpose), as the native model
                t = t.T.contiguous().T
            params[name] = t
            done += math.prod(shape) * 4
            if progress is not None:
                progress(name, done, total)
        return cls(cfg, params, device, tok)

    # -- forward --------------------------------------------------------------------------------
    def new_cache(self) -> tuple[list[Tensor], list[Tensor]]:
        from ..backends.wgpu import ops as gops

        cfg = self.config
        shape = (cfg.n_positions, cfg.n_head, cfg.head_dim)
        return ([gops.empty(self.device, shape, dt.float32) for _ in range(cfg.n_layer)],
                [gops.empty(self.device, shape, dt.float32) for _ in range(cfg.n_layer)])

    def forward(self, ids: Sequence[int], cache: tuple[list[Tensor], list[Tensor]], p0: int) -> Tensor:
        """Tokens `ids` at positions p0.. (their keys / values appended to `cache`) -> logits (1, V)
        of the last position."""
        idt = from_buffer(array.array("i", ids), (len(ids),), dt.int32, self.device)
        kc, vc = cache
        return _gpt2_module("forward").forward(self.config, self.wte, self.wpe, self.ln_f, self.blocks, idt, kc, vc,
                                               p0, last_only=True, lm_head=self.lm_head)

    def _decode_graph(self) -> Any:
        """(cache, DecodeGraph) for greedy decoding, built once; None where the graph does not apply."""
        if self._graph is None:
            dg = _gpt2_module("decode_graph")
            if not dg.supported(self):
                self._graph = False
            else:
                kc, vc = self.new_cache()
                cache = types.SimpleNamespace(k=kc, v=vc)
                self._graph = ((kc, vc), dg.DecodeGraph(self, cache, self.config.n_positions))
        return self._graph or None

    # -- generation -----------------------------------------------------------------------------
    def generate_ids(self, ids: Sequence[int], max_new_tokens: int = 32, temperature: float = 0.0,
                     top_k: int | None = None, seed: int | None = None,
                     stop_at_eos: bool = True) -> Iterator[int]:
        """Yield new token ids one by one: greedy at temperature 0 (argmax on the GPU, a 4-byte
        readback), else sampled from softmax(logits / temperature), optionally over the top k."""
        ids = [int(i) for i in ids]
        V, n_ctx = self.config.vocab_size, self.config.n_positions
        if not ids:
            raise SamplingError("the prompt is empty: give at least one token")
        if any(not 0 <= i < V for i in ids):
            raise SamplingError(f"a token id is out of range for a vocabulary of {V}")
        if not (isinstance(max_new_tokens, int) and max_new_tokens >= 0):
            raise SamplingError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if not (temperature >= 0 and math.isfinite(temperature)):
            raise SamplingError(f"temperature must be a finite number >= 0, got {temperature}")
        if top_k is not None and top_k < 1:
            raise SamplingError(f"top_k must be >= 1, got {top_k}")
        if len(ids) + max_new_tokens > n_ctx:
            raise ContextLengthError(f"prompt of {len(ids)} tokens + {max_new_tokens} new tokens exceeds the "
                                     f"model's context of {n_ctx} positions")
        stats = self.last_stats = GenerationStats(prompt_tokens=len(ids))
        rng = random.Random(seed)
        eos = self.config.eos_ids if stop_at_eos else frozenset()
        graph = self._decode_graph()
        cache = graph[0] if graph is not None else self.new_cache()
        p0, tok_in = 0, ids
        t0 = time.perf_counter()
        for step in range(max_new_tokens):
            if step == 1 and graph is not None and temperature == 0:  # greedy: replay the prebuilt step
                for tok in graph[1].greedy(p0, tok_in[0], max_new_tokens - 1):
                    stats.decode_s = time.perf_counter() - t0 - stats.prefill_s
                    stats.new_tokens += 1
                    stats.token_ids.append(tok)
                    yield tok
                    if tok in eos:
                        return
                return
            if step > 0 and graph is not None:  # sampling: the graph's step, logits read back
                tok = _sample(array.array("f", bytes(graph[1].logits_after(p0, tok_in[0]))), temperature, top_k, rng)
            else:
                with self.device.dispatch_scope():
                    logits = self.forward(tok_in, cache, p0)
                    if temperature == 0:
                        tok = int.from_bytes(ops.argmax(logits).tobytes()[:4], "little", signed=True)
                if temperature != 0:
                    tok = _sample(array.array("f", logits.tobytes()), temperature, top_k, rng)
            p0 += len(tok_in)
            now = time.perf_counter()
            if step == 0:
                stats.prefill_s = now - t0
            else:
                stats.decode_s = now - t0 - stats.prefill_s
            stats.new_tokens += 1
            stats.token_ids.append(tok)
            yield tok
            if tok in eos:
                return
            tok_in = [tok]

    def generate(self, ids: Sequence[int], max_new_tokens: int = 32, **kw: Any) -> list[int]:
        return list(self.generate_ids(ids, max_new_tokens, **kw))

    def stream(self, prompt: str, max_new_tokens: int = 50, **kw: Any) -> Iterator[str]:
        """Generated text, piece by piece, as soon as it forms whole UTF-8 characters."""
        tok = self.tokenizer
        yield from _gpt2_module("tokenizer").stream_text(
            self.generate_ids(tok.encode(prompt), max_new_tokens, **kw), tok.token_bytes)


def _sample(logits: Sequence[float], temperature: float, top_k: int | None, rng: random.Random) -> int:
    """Draw from softmax(logits / temperature), restricted to the top_k largest when given."""
    idx: Sequence[int] = range(len(logits))
    if top_k is not None and top_k < len(logits):
        idx = sorted(idx, key=logits.__getitem__, reverse=True)[:top_k]
    vals = [logits[i] / temperature for i in idx]
    m = max(vals)
    weights = [math.exp(v - m) for v in vals]
    return idx[rng.choices(range(len(idx)), weights=weights)[0]]
