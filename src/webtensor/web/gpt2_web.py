"""GPT-2 generation without numpy: the browser's driver for webtensor's GPT-2.

It runs the same forward pass as `webtensor.models.gpt2.model.GPT2` (embedding + positions, per
block layer norm -> fused QKV linear -> KV-cache rows -> causal attention -> fused projection with
residual -> layer norm -> fused linear + activation -> fused linear with residual, then the final layer
norm and the LM head, wte when tied), through `webtensor.ops` on a WebGPU device, but loads the checkpoint
with the pure-Python safetensors reader, tokenizes with the pure-Python BPE where `tokenizers` is
missing, and samples with `models.gpt2.sampling.sample`'s pure-Python path (the one sampler
of every path, so a seed gives the native model's tokens): nothing here imports numpy.

Natively it runs too (on wgpu-py), which is how its tokens are checked against `GPT2.generate`
without a browser.
"""

from __future__ import annotations

import array
import importlib
import math
import struct
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import dtypes as dt
from .. import ops
from ..device import Device
from ..errors import CheckpointError
from ..io.safetensors_pure import SafetensorsFile, SafetensorsFormatError
from ..tensor import Tensor, from_buffer


def _gpt2_module(name: str) -> Any:
    """`webtensor.models.gpt2.<name>` (config, tokenizer, weights): numpy-free modules (the package
    imports its numpy model lazily)."""
    return importlib.import_module(f"webtensor.models.gpt2.{name}")


def _to_float32(raw: memoryview, st_dtype: str, name: str) -> memoryview | bytes:
    """A tensor's stored bytes as little-endian float32 bytes."""
    if st_dtype == "F32":
        return raw
    if st_dtype == "F16":
        n = raw.nbytes // 2
        return struct.pack(f"<{n}f", *struct.unpack(f"<{n}e", raw))
    if st_dtype == "BF16":
        halves = array.array("H", bytes(raw))
        if sys.byteorder != "little":
            halves.byteswap()
        out = array.array("I", (h << 16 for h in halves))
        if sys.byteorder != "little":
            out.byteswap()
        return out.tobytes()
    raise CheckpointError(f"tensor {name!r} has dtype {st_dtype}; GPT-2 weights must be F32, F16 or BF16")


def _stored_float32(where: dict[str, tuple[SafetensorsFile, str]], name: str) -> memoryview | bytes:
    sf, key = where[name]
    return _to_float32(sf.raw(key), sf.info(key).dtype, name)


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
                sf = SafetensorsFile.from_path(f)
            except (SafetensorsFormatError, OSError) as e:
                raise CheckpointError(f"{f} could not be read as safetensors: {e}") from e
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
            sf, key = where[name]
            info = sf.info(key)
            t = from_buffer(_to_float32(sf.raw(key), info.dtype, name), shape, dt.float32, device)
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
                     top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                     stop_at_eos: bool = True, truncate_prompt: bool = False) -> Iterator[int]:
        """Yield new token ids one by one, with `GPT2.generate_ids`' checks, messages and sampler:
        greedy at temperature 0 (argmax on the GPU, a 4-byte readback), else `sampling.sample` for
        each position (temperature, top-k, top-p, seeded by (seed, position); seed None: one fresh
        seed for the call, kept in `last_stats.seed`). A prompt that does not fit the context is
        refused (ContextLengthError) unless `truncate_prompt`, which keeps its last tokens."""
        sampling, validate = _gpt2_module("sampling"), _gpt2_module("validate")
        params = sampling.SamplingParams(temperature, top_k, top_p, seed)
        n_new = validate.check_max_new_tokens(max_new_tokens)
        ids = validate.check_ids(ids, self.config.vocab_size)
        ids = validate.fit_context(ids, n_new, self.config.n_positions, truncate_prompt)
        params = sampling.with_seed(params)
        stats = self.last_stats = GenerationStats(prompt_tokens=len(ids), seed=params.seed)
        eos = self.config.eos_ids if stop_at_eos else frozenset()
        graph = self._decode_graph()
        cache = graph[0] if graph is not None else self.new_cache()
        p0, tok_in = 0, ids
        t0 = time.perf_counter()
        for step in range(n_new):
            if step == 1 and graph is not None and params.greedy:  # greedy: replay the prebuilt step
                for tok in graph[1].greedy(p0, tok_in[0], n_new - 1):
                    stats.decode_s = time.perf_counter() - t0 - stats.prefill_s
                    stats.new_tokens += 1
                    stats.token_ids.append(tok)
                    yield tok
                    if tok in eos:
                        return
                return
            position = p0 + len(tok_in)  # where the token chosen now goes
            if step > 0 and graph is not None:  # sampling: the graph's step, logits read back
                logits = array.array("f", bytes(graph[1].logits_after(p0, tok_in[0])))
                tok = sampling.sample(logits, params, position)
            else:
                with self.device.dispatch_scope():
                    out = self.forward(tok_in, cache, p0)
                    if params.greedy:
                        tok = int.from_bytes(ops.argmax(out).tobytes()[:4], "little", signed=True)
                if not params.greedy:
                    tok = sampling.sample(array.array("f", out.tobytes()), params, position)
            p0 = position
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
        ids = tok.encode(_gpt2_module("validate").check_text(prompt))
        yield from _gpt2_module("tokenizer").stream_text(self.generate_ids(ids, max_new_tokens, **kw), tok.token_bytes)

