"""q8_0 weights on WebGPU under their old names, for the callers that still use them
(models/loader.py, web/gpt2_web.py): q8_0 is now the Q8_0 case of `quant_ops`. New code uses
`quant_ops` directly; this module goes when its last caller does.
"""

from __future__ import annotations

from typing import Any

from .quant_ops import QuantGpu
from .quant_ops import upload as upload
from .quant_ops import upload_blocks as _upload_blocks


def upload_blocks(device: Any, raw: Any, shape: tuple[int, ...]) -> QuantGpu:
    """A q8_0 matrix (N, K) from ggml's bytes: `quant_ops.upload_blocks(device, "Q8_0", raw, shape)`."""
    return _upload_blocks(device, "Q8_0", raw, shape)
