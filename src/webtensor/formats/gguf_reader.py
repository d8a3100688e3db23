"""GPT-2 checkpoints in llama.cpp's GGUF format, as `convert_hf_to_gguf.py` writes them: tensors in
F32, F16, BF16 or a quantized type webtensor runs (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K: `webtensor.quant`),
the hyper-parameters and the byte-level BPE tokenizer in the metadata. Read
through the `gguf` package's `GGUFReader`; where it is missing (the browser) the pure-Python
`gguf_pure` reader stands in, which tests check reads the same.

Names and layout. GGUF names map to Hugging Face GPT-2 names (llama.cpp's tensor map for the gpt2
architecture): token_embd -> wte, position_embd -> wpe, output_norm -> ln_f, and per block N
attn_norm -> ln_1, attn_qkv -> attn.c_attn, attn_output -> attn.c_proj, ffn_norm -> ln_2,
ffn_up -> mlp.c_fc, ffn_down -> mlp.c_proj. llama.cpp stores the four block matrices as
(out, in) = (N, K), the transpose of HF's Conv1D (K, N); `get` returns HF's layout (float), and
`get_quant` / `get_q8` the (N, K) layout that quantized blocks run along. GPT-2's LM head is tied
to wte: a separate `output` tensor (the converter writes a copy) is ignored, and refused only if it
is stored in the same type as token_embd with different bytes (a model whose head is not tied).

numpy is imported only where tensors become arrays (`get`, `get_quant`, `get_q8`): the page
(Pyodide, no numpy) opens a file with reader="pure" for its config, tokenizer and checks, and takes
each tensor's stored bytes with `stored` (BF16 made float32 by `gguf_pure.bf16_to_f32`, quantized
blocks uploaded as they are by `backends.wgpu.quant_ops.upload_blocks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError, TokenizerError
from ..models.gpt2.config import GPT2Config
from ..quant import types as qtypes
from ..text.tokenizer import GPT2Tokenizer

if TYPE_CHECKING:
    import numpy as np

    from ..quant.weight import QuantWeight

FLOAT_TYPES = {"F32": 4, "F16": 2, "BF16": 2}  # bytes a value
SUPPORTED_TYPES = (*FLOAT_TYPES, *qtypes.TYPES)
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4  # llama.cpp's token types for special / added tokens
_BLOCK_NAMES = {  # GGUF suffix -> HF name under h.N.
    "attn_norm.weight": "ln_1.weight", "attn_norm.bias": "ln_1.bias",
    "attn_qkv.weight": "attn.c_attn.weight", "attn_qkv.bias": "attn.c_attn.bias",
    "attn_output.weight": "attn.c_proj.weight", "attn_output.bias": "attn.c_proj.bias",
    "ffn_norm.weight": "ln_2.weight", "ffn_norm.bias": "ln_2.bias",
    "ffn_up.weight": "mlp.c_fc.weight", "ffn_up.bias": "mlp.c_fc.bias",
    "ffn_down.weight": "mlp.c_proj.weight", "ffn_down.bias": "mlp.c_proj.bias",
}
_TOP_NAMES = {"token_embd.weight": "wte.weight", "position_embd.weight": "wpe.weight",
              "output_norm.weight": "ln_f.weight", "output_norm.bias": "ln_f.bias"}
_TRANSPOSED = ("attn_qkv.weight", "attn_output.weight", "ffn_up.weight", "ffn_down.weight")


_GGUF_OF_BLOCK = {hf: g for g, hf in _BLOCK_NAMES.items()}  # the same tables, HF -> GGUF (for gguf_writer)
_GGUF_OF_TOP = {hf: g for g, hf in _TOP_NAMES.items()} | {"lm_head.weight": "output.weight"}


def gguf_name(hf: str) -> str:
    """The GGUF name of HF GPT-2 tensor `hf` ("h.3.mlp.c_fc.weight" -> "blk.3.ffn_up.weight"), the
    inverse of `hf_name`; an untied LM head is llama.cpp's `output.weight`."""
    if hf in _GGUF_OF_TOP:
        return _GGUF_OF_TOP[hf]
    _, n, rest = hf.split(".", 2)
    return f"blk.{n}.{_GGUF_OF_BLOCK[rest]}"


def hf_name(gguf_name: str) -> str | None:
    """The HF GPT-2 name of a GGUF tensor name, or None if GPT-2 has no such tensor."""
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK_NAMES:
        return f"h.{int(parts[1])}.{_BLOCK_NAMES[parts[2]]}"
    return None


@dataclass(frozen=True)
class _Entry:
    """One stored tensor: its ggml type, numpy-order shape and a reader of its raw bytes."""

    type_name: str
    shape: tuple[int, ...]
    read: Callable[[], Any]  # -> the stored bytes (a buffer)
    transposed: bool  # stored (N, K) where HF has (K, N)


def _open_with_gguf(path: Path) -> tuple[dict[str, Any], dict[str, tuple[str, tuple[int, ...], Callable[[], Any]]]]:
    import gguf
    import numpy as np

    r = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = {}
    for t in r.tensors:
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        data = t.data
        if data.nbytes != t.n_bytes:
            raise CheckpointError(f"tensor {t.name!r} has {data.nbytes} of its {t.n_bytes} bytes (truncated file?)")
        tensors[t.name] = (t.tensor_type.name, shape, lambda d=data: d.reshape(-1).view(np.uint8))
    return meta, tensors


def _open_pure(path: Path) -> tuple[dict[str, Any], dict[str, tuple[str, tuple[int, ...], Callable[[], Any]]]]:
    from .gguf_pure import GGUFFile

    f = GGUFFile.from_path(path)
    tensors = {n: (t.type_name, t.shape, lambda n=n: f.raw(n)) for n, t in f.tensors.items()}
    return f.metadata, tensors


class GGUFCheckpoint:
    """A GPT-2 GGUF file: `config`, `tokenizer`, `metadata`, and its tensors by HF name."""

    def __init__(self, path: str | Path, reader: str = "auto"):
        """Open and check `path`. reader: "gguf" (the gguf package), "pure" (gguf_pure), or
        "auto" (the package where it is installed). Raises CheckpointError (TokenizerError for a
        bad vocabulary) naming the file and the problem."""
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"GGUF file {self.path} does not exist")
        if reader == "auto":
            try:
                import gguf  # noqa: F401

                reader = "gguf"
            except ImportError:
                reader = "pure"
        opener = {"gguf": _open_with_gguf, "pure": _open_pure}.get(reader)
        if opener is None:
            raise CheckpointError(f"unknown GGUF reader {reader!r}: expected 'auto', 'gguf' or 'pure'")
        try:
            meta, stored = opener(self.path)
        except CheckpointError as e:
            raise CheckpointError(f"{self.path}: {e}") from e
        except Exception as e:  # the readers raise ValueError, KeyError, struct errors ... on bad bytes
            raise CheckpointError(f"{self.path} is not a valid GGUF file (truncated or corrupt?): {e}") from e
        self.metadata: dict[str, Any] = meta
        self.config = self._config()
        self.tokenizer = self._tokenizer()
        self._entries: dict[str, _Entry] = {}
        for name, (tname, shape, read) in stored.items():
            hf = hf_name(name)
            if hf is None:
                if name != "output.weight":
                    raise CheckpointError(f"{self.path}: tensor {name!r} is not part of a GPT-2 model")
                continue
            self._entries[hf] = _Entry(tname, shape, read, name.split(".", 2)[-1] in _TRANSPOSED)
        self._check_tensors(stored)

    # -- metadata ---------------------------------------------------------------------------------
    def _meta(self, key: str, kind: type, required: bool = True) -> Any:
        v = self.metadata.get(key)
        if v is None:
            if required:
                raise CheckpointError(f"{self.path}: metadata key {key!r} is missing")
            return None
        ok = isinstance(v, kind) and not (kind is int and isinstance(v, bool))
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v, ok = float(v), True
        if not ok:
            raise CheckpointError(f"{self.path}: metadata {key!r} should be {kind.__name__}, got {v!r}")
        return v

    def _config(self) -> GPT2Config:
        arch = self._meta("general.architecture", str)
        if arch != "gpt2":
            raise CheckpointError(f"{self.path}: architecture {arch!r} is not supported, only 'gpt2'")
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        vocab = self._meta("gpt2.vocab_size", int, required=False)
        if vocab is None:
            if not isinstance(tokens, list):
                raise CheckpointError(f"{self.path}: neither gpt2.vocab_size nor tokenizer.ggml.tokens gives the "
                                      "vocabulary size")
            vocab = len(tokens)
        cfg = GPT2Config(
            vocab_size=vocab,
            n_positions=self._meta("gpt2.context_length", int),
            n_embd=self._meta("gpt2.embedding_length", int),
            n_layer=self._meta("gpt2.block_count", int),
            n_head=self._meta("gpt2.attention.head_count", int),
            layer_norm_epsilon=self._meta("gpt2.attention.layer_norm_epsilon", float),
            eos_token_id=self._meta("tokenizer.ggml.eos_token_id", int, required=False),
            bos_token_id=self._meta("tokenizer.ggml.bos_token_id", int, required=False),
        )
        if min(cfg.vocab_size, cfg.n_positions, cfg.n_embd, cfg.n_layer, cfg.n_head) <= 0 or cfg.n_embd % cfg.n_head:
            raise CheckpointError(f"{self.path}: inconsistent sizes (embedding_length={cfg.n_embd} must be a positive "
                                  f"multiple of head_count={cfg.n_head}, all sizes > 0)")
        if not 0 <= cfg.layer_norm_epsilon < math.inf:
            raise CheckpointError(f"{self.path}: layer_norm_epsilon must be finite and >= 0, "
                                  f"got {cfg.layer_norm_epsilon}")
        ff = self._meta("gpt2.feed_forward_length", int, required=False)
        if ff is not None and ff != 4 * cfg.n_embd:
            raise CheckpointError(f"{self.path}: feed_forward_length {ff} is not 4 x embedding_length "
                                  f"({4 * cfg.n_embd}) as GPT-2 needs")
        return cfg

    def _tokenizer(self) -> GPT2Tokenizer:
        src = f"{self.path} (tokenizer metadata)"
        model = self.metadata.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise TokenizerError(f"{src}: tokenizer.ggml.model is {model!r}; webtensor reads GPT-2's byte-level "
                                 "BPE ('gpt2')")
        tokens, merges = self.metadata.get("tokenizer.ggml.tokens"), self.metadata.get("tokenizer.ggml.merges")
        types = self.metadata.get("tokenizer.ggml.token_type") or []
        if not (isinstance(tokens, list) and isinstance(merges, list) and isinstance(types, list)):
            raise TokenizerError(f"{src}: tokenizer.ggml.tokens and tokenizer.ggml.merges must be lists of strings")
        if types and len(types) != len(tokens):
            raise TokenizerError(f"{src}: {len(types)} token types for {len(tokens)} tokens")
        if len(tokens) > self.config.vocab_size:
            raise TokenizerError(f"{src}: {len(tokens)} tokens but a vocabulary of {self.config.vocab_size}")
        pairs = []
        for i, m in enumerate(merges):
            parts = m.split(" ") if isinstance(m, str) else []
            if len(parts) != 2:
                raise TokenizerError(f"{src}: merge #{i} {m!r} is not 'left right'")
            pairs.append((parts[0], parts[1]))
        special = [i for i, t in enumerate(types) if t == TOKEN_CONTROL]
        added = [i for i, t in enumerate(types) if t == TOKEN_USER_DEFINED]
        tok = GPT2Tokenizer.from_vocab(tokens, pairs, special, added, source=src)
        if self.config.eos_token_id is not None:
            tok.eos_token_id = self.config.eos_token_id
        return tok

    # -- tensors ----------------------------------------------------------------------------------
    def _check_tensors(self, stored: dict[str, Any]) -> None:
        from ..models.gpt2.weights import expected_shapes

        for name, shape in expected_shapes(self.config).items():
            e = self._entries.get(name)
            if e is None:
                raise CheckpointError(f"{self.path}: tensor {name!r} ({_gguf_name(name)}) is missing")
            if e.type_name not in SUPPORTED_TYPES:
                raise CheckpointError(f"{self.path}: tensor {_gguf_name(name)!r} is stored as {e.type_name}; webtensor "
                                      f"reads GGUF tensors in {', '.join(SUPPORTED_TYPES)} only (convert with "
                                      "--outtype f16 or q8_0)")
            if self.shape(name) != shape:
                raise CheckpointError(f"{self.path}: tensor {_gguf_name(name)!r} has shape {e.shape}, expected "
                                      f"{shape[::-1] if e.transposed else shape} from the metadata")
        out = stored.get("output.weight")
        emb = self._entries["wte.weight"]
        if out is not None and out[0] == emb.type_name and bytes(out[2]()) != bytes(emb.read()):
            raise CheckpointError(f"{self.path}: output.weight differs from token_embd.weight; webtensor's GPT-2 "
                                  "ties the LM head to the token embedding")

    def names(self) -> set[str]:
        return set(self._entries)

    def tensor_type(self, name: str) -> str:
        """The stored ggml type of HF tensor `name` (one of SUPPORTED_TYPES)."""
        return self._entries[name].type_name

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape in HF's layout."""
        e = self._entries[name]
        return e.shape[::-1] if e.transposed else e.shape

    def stored(self, name: str) -> tuple[str, tuple[int, ...], memoryview]:
        """HF tensor `name` as the file holds it, without numpy: (its ggml type, one of
        SUPPORTED_TYPES; its shape in GGUF's layout (numpy order: the block matrices (N, K),
        transposed from HF's); its bytes). CheckpointError when the bytes do not fill the shape (or
        a quantized tensor is not a matrix of whole blocks)."""
        e = self._entries[name]
        raw = memoryview(e.read()).cast("B")
        try:
            if e.type_name in qtypes.TYPES:
                qtypes.check_blocks(e.type_name, e.shape, raw.nbytes)
            elif raw.nbytes != math.prod(e.shape) * FLOAT_TYPES[e.type_name]:
                raise CheckpointError(f"{raw.nbytes} bytes where shape {e.shape} {e.type_name} needs "
                                      f"{math.prod(e.shape) * FLOAT_TYPES[e.type_name]}")
        except CheckpointError as err:
            raise CheckpointError(f"{self.path}: tensor {_gguf_name(name)!r}: {err}") from err
        return e.type_name, e.shape, raw

    def _stored(self, name: str) -> np.ndarray | QuantWeight:
        """The tensor as stored: float32 (F32, BF16 widened) / float16 in GGUF's layout, or a
        QuantWeight (N, K) of its blocks."""
        import numpy as np

        from ..quant.dequant import bf16_to_f32
        from ..quant.weight import QuantWeight

        tname, shape, raw = self.stored(name)
        try:
            if tname in qtypes.TYPES:
                return QuantWeight.from_blocks(tname, raw, shape)
            buf = np.frombuffer(raw, np.uint8)
            if tname == "BF16":
                return bf16_to_f32(buf).reshape(shape)
            return buf.view("<f4" if tname == "F32" else "<f2").reshape(shape).copy()
        except CheckpointError as err:
            raise CheckpointError(f"{self.path}: tensor {_gguf_name(name)!r}: {err}") from err
        except Exception as err:
            raise CheckpointError(f"{self.path}: tensor {_gguf_name(name)!r} could not be read: {err}") from err

    def get(self, name: str) -> np.ndarray:
        """HF tensor `name` in HF's layout: float32 (F32, BF16, and quantized types dequantized) or
        float16 (F16)."""
        import numpy as np

        from ..quant.weight import QuantWeight

        e = self._entries[name]
        v = self._stored(name)
        arr = v.dequantize() if isinstance(v, QuantWeight) else v
        return np.ascontiguousarray(arr.T) if e.transposed else arr

    def get_quant(self, name: str) -> QuantWeight:
        """HF tensor `name` as its stored blocks: a QuantWeight (N, K) (K = the input dimension;
        an embedding table (V, C)) in the file's type, not copied. CheckpointError where the file
        holds it in a float type."""
        v = self._stored(name)
        if not isinstance(v, qtypes.Quantized):
            raise CheckpointError(f"{self.path}: tensor {_gguf_name(name)!r} is stored as "
                                  f"{self._entries[name].type_name}, not in a quantized type")
        return v

    def get_q8(self, name: str) -> QuantWeight:
        """HF matrix `name` as Q8_0 in (N, K) layout (K = the input dimension): a Q8_0 tensor as
        stored; another type read as float32 (dequantized) and quantized to Q8_0 now."""
        import numpy as np

        from ..quant.quantizer import quantize

        e = self._entries[name]
        v = self._stored(name)
        if isinstance(v, qtypes.Quantized):
            if v.qtype == "Q8_0":
                return v
            v = v.dequantize()
        elif not e.transposed and name != "wte.weight":
            raise CheckpointError(f"{name!r} is not a matrix that webtensor runs in q8_0")
        return quantize(v.astype(np.float32), "Q8_0")


def _gguf_name(hf: str) -> str:
    """The GGUF name of HF tensor `hf` (for messages)."""
    for g, h in _TOP_NAMES.items():
        if h == hf:
            return g
    _, n, rest = hf.split(".", 2)
    return f"blk.{n}." + next(g for g, h in _BLOCK_NAMES.items() if h == rest)


def find_gguf(model: Any) -> Path | None:
    """The GGUF file `model` names: a file (any name: its magic is checked when read), or a
    directory holding exactly one *.gguf and no safetensors checkpoint. None otherwise (the
    safetensors loader takes over); CheckpointError for a directory with several GGUF files."""
    if model is None:
        return None
    p = Path(model).expanduser()
    if p.is_file():
        return p
    if not p.is_dir() or any(p.glob("*.safetensors")):
        return None
    files = sorted(p.glob("*.gguf"))
    if len(files) > 1:
        raise CheckpointError(f"{p} holds several GGUF files ({', '.join(f.name for f in files)}): pass one of them")
    return files[0] if files else None
