"""GPT-2 with dtype="int8": which weights are held in llama.cpp's q8_0 format and how they get
there. The token embedding (also the tied LM head) and the four matrices of each block are q8_0;
layer norms, biases and the position embedding stay float32, as llama.cpp keeps them. Matrices
become `Q8Weight`s in (N, K) layout (K = the input dimension), the transpose of HF's Conv1D
(K, N); wte stays (V, C), the layout the LM head (x @ wte.T) and the embedding lookup read. numpy is imported only
to quantize (the page, without it, uses `is_int8` and `held_in_q8`)."""

from __future__ import annotations

from typing import Any

INT8_NAMES = ("int8", "q8_0")
_BLOCK_MATRICES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def is_int8(dtype: Any) -> bool:
    """Whether a from_pretrained dtype asks for q8_0 weights ("int8", or "q8_0")."""
    return isinstance(dtype, str) and dtype.lower() in INT8_NAMES


def held_in_q8(name: str) -> bool:
    """Whether HF tensor `name` is held as a Q8Weight under dtype="int8"."""
    return name == "wte.weight" or (name.startswith("h.") and name.endswith(_BLOCK_MATRICES))


class Int8Reader:
    """Wraps a checkpoint reader (`get(name)`, HF layout): the q8_0 tensors come back as Q8Weight,
    taken as stored where the reader has them in q8_0 (`get_q8`, GGUF), else quantized at load."""

    def __init__(self, reader: Any):
        self.reader = reader

    def get(self, name: str) -> Any:
        if not held_in_q8(name):
            return self.reader.get(name)
        get_q8 = getattr(self.reader, "get_q8", None)
        if get_q8 is not None:
            return get_q8(name)
        import numpy as np

        from ...formats import q8_0

        w = np.asarray(self.reader.get(name), np.float32)
        return q8_0.quantize(w if name == "wte.weight" else w.T)
