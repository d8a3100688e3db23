"""GPT-2 generation without numpy: the browser's driver for webtensor's GPT-2.

It runs the same forward pass as `webtensor.models.gpt2.model.GPT2` (embedding + positions, per
block layer norm -> fused QKV linear -> KV-cache rows -> causal attention -> fused projection with
residual -> layer norm -> fused linear + activation -> fused linear with residual, then the final layer
norm and the LM head, wte when tied), through `webtensor.ops` on a WebGPU device, but loads the checkpoint
with the pure-Python safetensors reader (or, for dtype int8, a q8_0 GGUF file with the pure-Python
GGUF reader: its blocks go to the GPU as they are, never through float32), tokenizes with the
pure-Python BPE where `tokenizers` is missing, and generates with `webtensor.generation` (the native model's loop) and
`webtensor.sampling.sample`'s pure-Python path (one sampler for every path, so a seed gives the
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
from .. import generation, sampling, validate
from ..device import Device
from ..errors import CheckpointError
from ..formats.safetensors_pure import SafetensorsFile
from ..models.gpt2.forward import GPT2Weights
from ..tensor import Tensor, from_buffer
from ..text.tokenizer import GPT2Tokenizer, stream_text

DTYPES = ("float32", "float16", "int8")  # what the page loads a model in


def _gpt2_module(name: str) -> Any:
    """`webtensor.models.gpt2.<name>` (config, tokenizer, weights): numpy-free modules (the package
    imports its numpy model lazily)."""
    return importlib.import_module(f"webtensor.models.gpt2.{name}")


def _stored_float32(where: dict[str, tuple[SafetensorsFile, str]], name: str) -> memoryview:
    sf, key = where[name]
    return sf.float32(key)


def _in_float16(name: str) -> bool:
    """Under dtype float16: the matrices and wte (not layer norms, biases, wpe), as the native model."""
    return name.endswith(".weight") and "ln_" not in name and name != "wpe.weight"


def _load_safetensors(d: Path, cfg: Any, device: Device, dtype: dt.DType,
                      progress: Callable[[str, int, int], None] | None) -> dict[str, Tensor]:
    """The float weights of model.safetensors (every *.safetensors of `d`), by HF name."""
    weights = _gpt2_module("weights")
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
        if dtype is dt.float16 and _in_float16(name):
            t = t.to(dt.float16)
        if len(shape) == 2 and name.startswith("h.") and device.backend.kmajor_weights:  # as the native model
            t = t.T.contiguous().T
        params[name] = t
        done += math.prod(shape) * 4
        if progress is not None:
            progress(name, done, total)
    return params


def _load_q8_gguf(d: Path, cfg: Any, device: Device,
                  progress: Callable[[str, int, int], None] | None) -> dict[str, Any]:
    """The int8 weights of the one *.gguf file in `d` (what `webtensor web` serves: formats/gguf_writer),
    by HF name: Q8_0 matrices as `Q8Gpu`s built from their blocks, F32 tensors as float32."""
    from ..backends.wgpu import q8_ops
    from ..formats.gguf_pure import GGUFFile, GGUFFormatError
    from ..formats.gguf_reader import hf_name

    weights, quantized = _gpt2_module("weights"), _gpt2_module("quantized")
    if device.kind != "wgpu":
        raise CheckpointError(f"the page's int8 loader runs on WebGPU, not on {device.describe()}")
    files = sorted(d.glob("*.gguf"))
    if len(files) != 1:
        raise CheckpointError(f"{d} must hold exactly one .gguf file for dtype int8, found {len(files)}")
    try:
        f = GGUFFile.from_path(files[0])
    except (OSError, GGUFFormatError) as e:
        raise CheckpointError(f"{files[0]} is not a valid GGUF file (truncated or corrupt?): {e}") from e
    stored: dict[str, Any] = {}  # HF name -> TensorInfo
    for name, info in f.tensors.items():
        hf = "lm_head.weight" if name == "output.weight" else hf_name(name)
        if hf is None:
            raise CheckpointError(f"{files[0]}: tensor {name!r} is not part of a GPT-2 model")
        stored[hf] = info
    hf_shape = {n: (i.shape[::-1] if len(i.shape) == 2 and n.startswith("h.") else i.shape) for n, i in stored.items()}
    weights.check_shapes(hf_shape, cfg, files[0])
    shapes = weights.expected_shapes(cfg)
    if not cfg.tie_word_embeddings:
        if "lm_head.weight" not in stored:
            raise CheckpointError(f"{files[0]}: tie_word_embeddings = false but the file has no output.weight")
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.n_embd)
    total = sum(stored[n].nbytes for n in shapes)
    done = 0
    params: dict[str, Any] = {}
    for name in shapes:
        info = stored[name]
        want = "Q8_0" if quantized.held_in_q8(name) else "F32"
        if info.type_name != want:
            raise CheckpointError(f"{files[0]}: tensor {info.name!r} is {info.type_name}; the page's int8 model reads "
                                  f"{want} there (write the file with `webtensor.formats.gguf_writer`, outtype q8_0)")
        raw = f.raw(info.name)
        if want == "Q8_0":
            params[name] = q8_ops.upload_blocks(device, raw, info.shape)  # (N, K)
        else:
            params[name] = from_buffer(raw, info.shape, dt.float32, device)
        done += info.nbytes
        if progress is not None:
            progress(name, done, total)
    return params


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
        self.dtype = "float32"  # the weights' dtype as the page names it (DTYPES)
        self._workspaces = generation.WorkspacePool()
        self.last_stats = GenerationStats()

    # -- loading --------------------------------------------------------------------------------
    @classmethod
    def load(cls, model_dir: str | Path, device: Device,
             progress: Callable[[str, int, int], None] | None = None, dtype: str = "float32") -> WebGPT2:
        """Load config.json, the weights and the tokenizer from `model_dir` onto `device`.
        `progress(name, done_bytes, total_bytes)` is called after each tensor is uploaded.

        dtype "float32" or "float16" (matrices and wte in float16, the rest float32, as the native
        model; needs shader-f16) read model.safetensors; "int8" reads the one *.gguf file of the
        folder, whose wte and block matrices must be Q8_0 (the rest F32): the weights of
        `GPT2.from_pretrained(..., dtype="int8")`, held as q8_0 on the device."""
        if dtype not in DTYPES and not _gpt2_module("quantized").is_int8(dtype):
            raise CheckpointError(f"the page loads a model in {', '.join(DTYPES)}, not {dtype!r}")
        d = Path(model_dir)
        config, weights = (_gpt2_module(m) for m in ("config", "weights"))
        cfg = config.GPT2Config.from_file(d / "config.json")
        tok = GPT2Tokenizer.from_dir(d)
        weights.check_tokenizer(cfg, tok.vocab_size, d)
        if dtype == "float16" and not device.has_f16:
            raise CheckpointError(f"{device.describe()} has no shader-f16 feature: use dtype float32 or int8")
        if dtype in ("float32", "float16"):
            params = _load_safetensors(d, cfg, device, dt.as_dtype(dtype), progress)
        else:
            params = _load_q8_gguf(d, cfg, device, progress)
        m = cls(cfg, params, device, tok)
        m.dtype = "int8" if dtype not in ("float32", "float16") else dtype
        return m

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights take on the device (q8_0: quants and scales)."""
        ts = [self.wte, self.wpe, *self.ln_f, *(t for b in self.blocks for t in b)]
        if self.lm_head is not self.wte:
            ts.append(self.lm_head)
        return sum(t.nbytes for t in ts)

    # -- generation -----------------------------------------------------------------------------
    def generate_ids(self, ids: Sequence[int], max_new_tokens: int = 32, temperature: float = 0.0,
                     top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                     stop_at_eos: bool = True, truncate_prompt: bool = False) -> Iterator[int]:
        """Yield new token ids one by one, as `GPT2.generate_ids` does (the same checks and
        messages, the same loop in `webtensor.generation`, the same sampler: one seed, one text)."""

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
        ids = tok.encode(validate.check_text(prompt))
        yield from stream_text(self.generate_ids(ids, max_new_tokens, **kw), tok.token_bytes)

