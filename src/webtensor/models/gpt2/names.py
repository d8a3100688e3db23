"""GPT-2's tensor map: each weight's canonical name (Hugging Face's, without GPT2LMHeadModel's "transformer."
prefix), its shape (HF layout: the block matrices are Conv1D (K, N)) and role, its name in llama.cpp's GGUF files,
and the checks that a checkpoint's tensors agree with config.json (naming both values). numpy-free."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from ...errors import CheckpointError
from ..spec import TensorSpec
from .config import GPT2Config

# GGUF suffix under blk.N. -> HF name under h.N. (llama.cpp's tensor map for the gpt2 architecture)
_BLOCK_NAMES = {
    "attn_norm.weight": "ln_1.weight", "attn_norm.bias": "ln_1.bias",
    "attn_qkv.weight": "attn.c_attn.weight", "attn_qkv.bias": "attn.c_attn.bias",
    "attn_output.weight": "attn.c_proj.weight", "attn_output.bias": "attn.c_proj.bias",
    "ffn_norm.weight": "ln_2.weight", "ffn_norm.bias": "ln_2.bias",
    "ffn_up.weight": "mlp.c_fc.weight", "ffn_up.bias": "mlp.c_fc.bias",
    "ffn_down.weight": "mlp.c_proj.weight", "ffn_down.bias": "mlp.c_proj.bias",
}
_GGUF_OF_BLOCK = {hf: g for g, hf in _BLOCK_NAMES.items()}
_GGUF_OF_TOP = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
                "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias", "lm_head.weight": "output.weight"}
_MATRICES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def canonical(key: str) -> str | None:
    """A checkpoint key as webtensor names it: GPT2LMHeadModel's "transformer." prefix dropped; None for the
    tensors that take no part in generation (IGNORED_TENSORS)."""
    name = key.removeprefix("transformer.")
    return None if IGNORED_TENSORS.fullmatch(name) else name


def tensors(cfg: GPT2Config) -> dict[str, TensorSpec]:
    """Every weight the model reads, in load order, HF layout."""
    out = {}
    for name, shape in _iter_expected(cfg):
        if name in ("wte.weight", "lm_head.weight"):
            kind = "embedding"
        elif name.endswith(_MATRICES):
            kind = "conv1d"
        else:
            kind = "float32"  # layer norms, biases and the position table
        out[name] = TensorSpec(shape, kind)  # type: ignore[arg-type]
    return out


def gguf_name(hf: str) -> str:
    """The GGUF name of HF GPT-2 tensor `hf` ("h.3.mlp.c_fc.weight" -> "blk.3.ffn_up.weight")."""
    if hf in _GGUF_OF_TOP:
        return _GGUF_OF_TOP[hf]
    _, n, rest = hf.split(".", 2)
    return f"blk.{n}.{_GGUF_OF_BLOCK[rest]}"


def gguf_names(cfg: GPT2Config) -> dict[str, str]:
    return {name: gguf_name(name) for name in tensors(cfg)}


def expected_shapes(cfg: GPT2Config) -> dict[str, tuple[int, ...]]:
    return dict(_iter_expected(cfg))


def _iter_expected(cfg: GPT2Config) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Lazily, so that checking a config.json with an absurd n_layer stops at the first missing layer."""
    C, V, P, F = cfg.n_embd, cfg.vocab_size, cfg.n_positions, cfg.inner_dim
    yield from {"wte.weight": (V, C), "wpe.weight": (P, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}.items()
    if not cfg.tie_word_embeddings:
        yield "lm_head.weight", (V, C)  # torch Linear layout (V, C), like wte
    for i in range(cfg.n_layer):
        h = f"h.{i}."
        yield from {
            h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "ln_2.weight": (C,), h + "ln_2.bias": (C,),
            h + "attn.c_attn.weight": (C, 3 * C), h + "attn.c_attn.bias": (3 * C,),
            h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
            h + "mlp.c_fc.weight": (C, F), h + "mlp.c_fc.bias": (F,),
            h + "mlp.c_proj.weight": (F, C), h + "mlp.c_proj.bias": (C,),
        }.items()




# tensors a GPT-2 checkpoint may hold that do not take part in generation: the causal-mask buffers
# of old checkpoints (Hugging Face ignores them too) and GPT2DoubleHeadsModel's multiple-choice head
IGNORED_TENSORS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)|multiple_choice_head\..*")


def check_shapes(shapes: Mapping[str, tuple[int, ...]], cfg: GPT2Config, where: str) -> None:
    """Refuse a checkpoint whose tensors (`shapes`, by GPT-2 name) disagree with config.json: the
    sizes they imply first (naming both values), then each tensor, then tensors nobody would read."""
    _check_implied_sizes(shapes, cfg, where)
    expected = set()
    for name, shape in _iter_expected(cfg):
        expected.add(name)
        if name not in shapes:
            raise CheckpointError(f"{where}: tensor {name!r} is missing from the checkpoint")
        got = tuple(shapes[name])
        if got != shape:
            raise CheckpointError(f"{where}: tensor {name!r} has shape {got}, expected {shape} from config.json")
    extra = sorted(n for n in shapes if n not in expected and not IGNORED_TENSORS.fullmatch(n)
                   and not (n == "lm_head.weight" and cfg.tie_word_embeddings))
    if extra:
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        raise CheckpointError(f"{where}: the checkpoint holds tensors a GPT-2 LM does not have: "
                              f"{', '.join(map(repr, extra[:3]))}{more} (another architecture, or an extra head?)")


def _check_implied_sizes(shapes: Mapping[str, tuple[int, ...]], cfg: GPT2Config, where: str) -> None:
    layers = {int(m.group(1)) for n in shapes if (m := re.match(r"h\.(\d+)\.", n))}
    n_layer = max(layers) + 1 if layers else 0
    if n_layer != cfg.n_layer:
        raise CheckpointError(f"{where}: the config says n_layer = {cfg.n_layer} but the checkpoint has "
                              f"{n_layer} layers (h.0 .. h.{n_layer - 1})")
    implied = [("vocab_size", "wte.weight", 0, cfg.vocab_size), ("n_embd", "wte.weight", 1, cfg.n_embd),
               ("n_positions", "wpe.weight", 0, cfg.n_positions),
               ("n_inner", "h.0.mlp.c_fc.weight", 1, cfg.inner_dim)]
    if not cfg.tie_word_embeddings:
        implied.append(("vocab_size", "lm_head.weight", 0, cfg.vocab_size))
    for field, name, axis, want in implied:
        shape = shapes.get(name)
        if shape is not None and len(shape) == 2 and shape[axis] != want:
            said = f"{cfg.n_inner} ({want})" if field == "n_inner" and cfg.n_inner is None else str(want)
            raise CheckpointError(f"{where}: the config says {field} = {said} but tensor {name!r} has shape "
                                  f"{tuple(shape)}, i.e. {field} = {shape[axis]}")
    if cfg.tie_word_embeddings and "lm_head.weight" in shapes and "wte.weight" in shapes \
            and tuple(shapes["lm_head.weight"]) != tuple(shapes["wte.weight"]):
        raise CheckpointError(f"{where}: tie_word_embeddings = true but lm_head.weight has shape "
                              f"{tuple(shapes['lm_head.weight'])}, wte.weight {tuple(shapes['wte.weight'])}")
