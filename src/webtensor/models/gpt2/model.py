"""GPT-2 on webtensor: loading Hugging Face checkpoints (safetensors or GGUF), the weights on the
device, and generation. The forward pass is `forward.py`'s, the decode loop `webtensor.generation`'s
(the prompt in one pass; each decode step a replayed graph of the same forward, reading back only
what sampling needs: 4 bytes a token for greedy, one row of logits otherwise).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ... import dtypes as dt
from ...device import Device
from ...errors import CheckpointError, ContextLengthError, SamplingError
from ...formats.gguf_reader import GGUFCheckpoint, find_gguf
from ...formats.q8_0 import Q8Weight
from ...generation import KVCache, Workspace, WorkspacePool, generate, generate_batch, int_tensor, prefill
from ...sampling import SamplingParams, check_max_new_tokens, sample, with_seed
from ...tensor import Tensor, tensor
from ...text.tokenizer import GPT2Tokenizer
from ...validate import check_ids, check_text, fit_context
from .config import GPT2Config
from .forward import BLOCK_PARAMS, GPT2Weights
from .quantized import Int8Reader, is_int8
from .weights import (
    SafetensorsReader,
    check_checkpoint,
    check_tied_head,
    check_tokenizer,
    expected_shapes,
    resolve,
    weight_files,
)


class GPT2(GPT2Weights):
    def __init__(self, cfg: GPT2Config, params: dict[str, Tensor], device: Device, dtype: dt.DType,
                 tokenizer: GPT2Tokenizer | None = None, name: str = "gpt2"):
        super().__init__(cfg, params, device)
        self.dtype, self.tokenizer, self.name = dtype, tokenizer, name
        self._workspaces = WorkspacePool()  # KV caches and decode graphs, reused by generate()
        self.quant: str | None = None  # "q8_0": wte and block matrices are Q8Weight (dtype="int8")

    # -- loading --------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, model: str | Path | None = None, device: Device | str | None = None,
                        dtype: Any = "float32", progress: bool | None = None) -> GPT2:
        """Load a Hugging Face GPT-2: a directory, an id in the local HF cache ("gpt2", "gpt2-xl",
        "openai-community/gpt2"), or None for the small model shipped with webtensor; or a llama.cpp
        GGUF file (F32, F16, Q8_0), or a directory holding one .gguf and no safetensors.

        dtype "int8" (or "q8_0"): wte and the block matrices are held as q8_0 `Q8Weight`s (see
        `quantized.py`; taken as stored from a Q8_0 GGUF, else quantized at load), everything else
        float32. Otherwise Q8_0 GGUF tensors are dequantized at load."""
        dev = Device.parse(device)
        int8 = is_int8(dtype)
        dtype = _check_dtype(dt.float32 if int8 else dt.as_dtype(dtype), dev)
        gguf_file = find_gguf(model)
        if gguf_file is not None:
            ck = GGUFCheckpoint(gguf_file)
            cfg, tok, reader, label = ck.config, ck.tokenizer, ck, gguf_file.name
        else:
            d = resolve(model)
            cfg = GPT2Config.from_file(d / "config.json")
            tok = GPT2Tokenizer.from_dir(d)
            check_tokenizer(cfg, tok.vocab_size, d)
            reader = SafetensorsReader(weight_files(d))
            check_checkpoint(reader, cfg, d)
            if cfg.tie_word_embeddings and "lm_head.weight" in reader.names():
                check_tied_head(np.array_equal(reader.get("lm_head.weight"), reader.get("wte.weight")), d)
            label = d.name
        params = _upload(Int8Reader(reader) if int8 else reader, cfg, dev, dtype, progress, label=label)
        m = cls(cfg, params, dev, dtype, tok, name=str(model) if model else "webtensor-shipped")
        m.quant = "q8_0" if int8 else None
        return m

    @classmethod
    def random(cls, cfg: GPT2Config, device: Device | str | None = None, dtype: Any = "float32",
               seed: int = 0, progress: bool | None = False) -> GPT2:
        """Random weights of GPT-2's shapes (benchmarks need no download); dtype "int8" quantizes them."""
        return cls.from_arrays(cfg, random_arrays(cfg, seed), device, dtype, progress,
                               name=f"random-{cfg.n_layer}x{cfg.n_embd}")

    @classmethod
    def from_arrays(cls, cfg: GPT2Config, arrays: dict[str, np.ndarray], device: Device | str | None = None,
                    dtype: Any = "float32", progress: bool | None = False, name: str = "gpt2") -> GPT2:
        """A model of float32 numpy weights by HF name (no tokenizer); dtype "int8" quantizes them."""
        dev = Device.parse(device)
        int8 = is_int8(dtype)
        dtype = _check_dtype(dt.float32 if int8 else dt.as_dtype(dtype), dev)
        reader: Any = _DictReader(arrays)
        params = _upload(Int8Reader(reader) if int8 else reader, cfg, dev, dtype, progress, name)
        m = cls(cfg, params, dev, dtype, None, name=name)
        m.quant = "q8_0" if int8 else None
        return m

    # -- forward --------------------------------------------------------------------------------
    def forward_cached(self, ids: Sequence[int], cache: KVCache) -> Tensor:
        """Run `ids` at positions cache.length.. of slot 0 of `cache` (appending their keys and
        values) and return the last position's logits (1, V), for callers that drive their own
        decode loop (the server's reference engine)."""
        ids = self._check_ids(ids)
        if cache.length + len(ids) > self.config.n_positions:
            raise ContextLengthError(f"{cache.length} cached + {len(ids)} new tokens exceed the context of "
                                     f"{self.config.n_positions} positions")
        logits = prefill(self, cache, ids, p0=cache.length)
        cache.length += len(ids)
        return logits

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Full forward over `ids`: logits (T, V) as float32 numpy."""
        ids = self._check_ids(ids)
        if len(ids) > self.config.n_positions:
            raise ContextLengthError(f"{len(ids)} tokens exceed the context of {self.config.n_positions}")
        dev, T = self.device, len(ids)
        with dev.dispatch_scope():
            out = self.forward(int_tensor(ids, dev), int_tensor(list(range(T)), dev), int_tensor([0] * T, dev),
                               self.new_cache(), (0, 0), False)
            return out.numpy().astype(np.float32, copy=False)

    # -- generation -----------------------------------------------------------------------------
    def generate_ids(self, ids: Sequence[int], max_new_tokens: int = 32, temperature: float = 0.0,
                     top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                     stop_at_eos: bool = True, truncate_prompt: bool = False) -> Iterator[int]:
        """Yield new token ids one by one. Refuses a prompt that does not fit (ContextLengthError)
        unless `truncate_prompt`, which keeps the prompt's last tokens. The same seed gives the
        same tokens on every device (a token's draw depends on the seed and its position only)."""
        params = with_seed(SamplingParams(temperature, top_k, top_p, seed))  # seed None: one fresh seed a call
        n_new = check_max_new_tokens(max_new_tokens)
        ids = fit_context(self._check_ids(ids), n_new, self.config.n_positions, truncate_prompt)
        eos = self.config.eos_ids if stop_at_eos else frozenset()
        ws = self._workspaces.acquire(lambda: Workspace(self, self.new_cache()))
        try:
            yield from generate(self, ws, ids, n_new, params.greedy, lambda row, p: sample(row, params, p), eos)
        finally:
            self._workspaces.release(ws)

    def generate_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32,
                       stop_at_eos: bool = True) -> list[list[int]]:
        """Greedy continuations of several prompts decoded together: one forward over all rows a
        step (the weights read once for the batch, as one matrix product), a captured graph
        replayed. Each list stops after its first EOS. The rows are not promised bit-identical to
        decoding each alone (the server's batched engine is: it multiplies row by row)."""
        n_new = check_max_new_tokens(max_new_tokens)
        rows = [list(fit_context(self._check_ids(p), n_new, self.config.n_positions, False)) for p in prompts]
        out: list[list[int]] = [[] for _ in rows]
        eos = self.config.eos_ids if stop_at_eos else frozenset()
        for column in generate_batch(self, rows, n_new):
            for r, tok in zip(out, column, strict=True):
                if not (r and r[-1] in eos):
                    r.append(tok)
        return out

    def generate(self, ids: Sequence[int], max_new_tokens: int = 32, **kw: Any) -> list[int]:
        """New token ids (a list), greedy by default (temperature=0)."""
        return list(self.generate_ids(ids, max_new_tokens, **kw))

    def stream(self, prompt: str, max_new_tokens: int = 50, **kw: Any) -> Iterator[str]:
        """Generated text, piece by piece, as soon as it forms whole UTF-8 characters."""
        tok = self._need_tokenizer()
        yield from tok.stream_decode(self.generate_ids(tok.encode(check_text(prompt)), max_new_tokens, **kw))

    def encode(self, text: str) -> list[int]:
        return self._need_tokenizer().encode(check_text(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self._need_tokenizer().decode(ids)

    def _need_tokenizer(self) -> GPT2Tokenizer:
        if self.tokenizer is None:
            raise SamplingError("this model has no tokenizer (random weights): pass token ids instead of text")
        return self.tokenizer

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        return check_ids(ids, self.config.vocab_size)


# -- weights upload -------------------------------------------------------------------------------
def _check_dtype(dtype: dt.DType, dev: Device) -> dt.DType:
    if dtype not in (dt.float32, dt.float16):
        raise CheckpointError(f"model dtype must be float32 or float16, got {dtype.name}")
    if dtype is dt.float16 and not dev.has_f16:
        raise CheckpointError(f"{dev.describe()} has no shader-f16 feature: use dtype float32")
    return dtype


def _stored_dtype(name: str, dtype: dt.DType) -> dt.DType:
    """Matrices (and wte) in the model's dtype; layer norms, biases and wpe stay float32."""
    if dtype is dt.float16 and name.endswith(".weight") and "ln_" not in name and name != "wpe.weight":
        return dt.float16
    return dt.float32


def random_arrays(cfg: GPT2Config, seed: int = 0) -> dict[str, np.ndarray]:
    """GPT-2-shaped float32 weights, N(0, 0.02) like GPT-2's init (layer-norm scales 1)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            arrays[name] = np.ones(shape, np.float32)
        else:
            arrays[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    return arrays


class _DictReader:
    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays

    def get(self, name: str) -> np.ndarray:
        return self.arrays[name]


def _upload(reader: Any, cfg: GPT2Config, dev: Device, dtype: dt.DType, progress: bool | None,
            label: str) -> dict[str, Tensor]:
    from tqdm.auto import tqdm

    shapes = expected_shapes(cfg)
    total = sum(int(np.prod(s)) * _stored_dtype(n, dtype).itemsize for n, s in shapes.items())
    disable = (not progress) if progress is not None else None  # None: only on a terminal
    params: dict[str, Tensor] = {}
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"loading {label}", disable=disable, leave=False) as bar:
        for name in shapes:
            value = reader.get(name)
            if isinstance(value, Q8Weight):  # dtype="int8": handed through as is (numpy, on any device)
                params[name] = value
                bar.update(value.nbytes)
                continue
            arr = np.asarray(value)
            if not np.issubdtype(arr.dtype, np.floating):
                raise CheckpointError(f"tensor {name!r} has dtype {arr.dtype}, expected a float type")
            arr = arr.astype(_stored_dtype(name, dtype).name, copy=False)
            if arr.ndim == 2 and name.startswith("h.") and dev.backend.kmajor_weights:
                # WebGPU stores matrices k-major, (N, K): the decode GEMV reads each output's
                # weights as one contiguous row. The model sees the (K, N) view, as in the checkpoint.
                params[name] = _to_device(np.ascontiguousarray(arr.T), dev).T
            else:
                params[name] = _to_device(arr, dev)
            bar.update(arr.nbytes)
    return params


def _to_device(arr: np.ndarray, dev: Device) -> Tensor:
    """A tensor of a weight the reader handed over. The readers hand over fresh arrays (safetensors)
    or read-only file maps (GGUF): a writeable contiguous one is kept as it is on the CPU (no second
    copy of each weight while loading), anything else is copied."""
    owned = arr.flags.writeable and arr.flags.c_contiguous
    return tensor(arr, device=dev) if not owned else dev.backend.from_numpy(dev, arr, True)


def _export_arrays(model: GPT2) -> dict[str, np.ndarray]:
    """The model's weights as float32 numpy arrays, by HF name (for side-by-side benchmarks; q8_0
    weights dequantized, block matrices back in HF's (K, N) layout)."""
    def arr(t: Any, name: str) -> np.ndarray:
        if isinstance(t, Q8Weight):
            w = t.dequantize()
            return w if name in ("wte.weight", "lm_head.weight") else w.T
        return t.numpy()

    out = {"wte.weight": arr(model.wte, "wte.weight"), "wpe.weight": model.wpe.numpy(),
           "ln_f.weight": model.ln_f[0].numpy(), "ln_f.bias": model.ln_f[1].numpy()}
    if model.lm_head is not model.wte:
        out["lm_head.weight"] = arr(model.lm_head, "lm_head.weight")
    for i, b in enumerate(model.blocks):
        for n, t in zip(BLOCK_PARAMS, b, strict=True):
            out[f"h.{i}.{n}"] = arr(t, n)
    return {k: v.astype(np.float32) for k, v in out.items()}
