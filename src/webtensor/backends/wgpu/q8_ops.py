"""q8_0 weights on WebGPU under their old names, for the page's int8 GPT-2 loader (web/gpt2_web.py
calls `upload_blocks(device, raw, shape)`): q8_0 is now the Q8_0 case of `quant_ops`. New code uses
`quant_ops` directly; this module goes when that loader does.
"""

from __future__ import annotations

from typing import Any

from .quant_ops import QuantGpu
from .quant_ops import upload_blocks as _upload_blocks


def upload_blocks(device: Any, raw: Any, shape: tuple[int, ...]) -> QuantGpu:
    """A q8_0 matrix (N, K) from ggml's bytes: `quant_ops.upload_blocks(device, "Q8_0", raw, shape)`."""
    return _upload_blocks(device, "Q8_0", raw, shape)
