"""Models whose every layer slides, for the tests of the KV blocks given back behind the window (docs/design-kv.md,
"Sliding windows"): the conformance suite's Mistral example with a window of 32 and a context of 512 (or any other
example and sizes), random weights from numpy (no torch: the core tier), written as a Hugging Face checkpoint
directory with the shipped tokenizer (its 4,096 ids are the example's vocabulary), so the runner, the scheduler and
the server process all load it. The LM head is scaled so that the logits spread over several units: greedy tokens
are then far from ties, and a sequence recomputed after a preemption (its prompt read in other chunks: products
summed in another order) keeps its tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

import webtensor as wt
from webtensor.models import loader, registry

SHIPPED = Path(__file__).resolve().parents[1] / "src" / "webtensor" / "models" / "shipped"
WINDOW, N_CTX = 32, 512
HEAD_GAIN = 50.0  # the LM head's weights N(0, 0.02) x this: logits of a few units' spread


def example_raw(family: str = "llama", example: str = "mistral", **changes: Any) -> dict[str, Any]:
    """A registered example config (`Family.examples`) with `changes` (e.g. sliding_window, max_position_embeddings)."""
    return {**registry.by_name(family).examples[example], **changes}


def write_checkpoint(d: Path, raw: dict[str, Any], seed: int = 0, head_gain: float = HEAD_GAIN) -> Path:
    """A checkpoint directory of config `raw`: config.json, model.safetensors (`loader.random_arrays`, the LM head
    times `head_gain` where it is its own matrix) and the shipped tokenizer."""
    from safetensors.numpy import save_file

    fam = registry.for_hf(raw["model_type"], str(d))
    cfg = fam.config_from_hf(dict(raw), str(d))
    arrays = loader.random_arrays(fam, cfg, seed)
    if "lm_head.weight" in arrays:
        arrays["lm_head.weight"] = arrays["lm_head.weight"] * np.float32(head_gain)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(raw, indent=2))
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json"):
        shutil.copy(SHIPPED / f, d / f)
    return d


_MODELS: dict[tuple[str, str], Any] = {}


def load(d: Path, device: wt.Device) -> Any:
    """The checkpoint in `d` on `device` (its whole context, a float32 KV cache), loaded once per device."""
    key = (str(d), device.describe())
    if key not in _MODELS:
        n_ctx = json.loads((d / "config.json").read_text())["max_position_embeddings"]
        _MODELS[key] = wt.load_model(d, device, n_ctx=n_ctx, kv_dtype="float32")
    return _MODELS[key]


def prompt(n: int, seed: int = 0) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(1, 4096, n)]
