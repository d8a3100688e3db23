"""What the runtime knows of any model family: a `ModelSpec` (sizes and token ids), the `TensorSpec` of each
weight (its shape in the Hugging Face layout and its role), and a `Family` — the one record a family registers
(its config parsers, tensor-name map and weight builder). The registry (`models.registry`) finds a family by a
Hugging Face `model_type` or a GGUF `general.architecture`; nothing outside a family's folder names one.
Importable without numpy (the page)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

TensorKind = Literal["linear", "conv1d", "embedding", "experts", "float32"]


@dataclass(frozen=True)
class ModelSpec:
    """The sizes and token ids every path needs, whatever the family."""

    family: str  # the registry's name ("gpt2", "llama")
    architecture: str  # the checkpoint's own name for it ("gpt2", "llama", "qwen2", "qwen3", "mistral")
    n_ctx: int  # positions the model was trained for
    vocab_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    width: int  # the residual stream's width
    eos_ids: frozenset[int] = frozenset()
    bos_id: int | None = None
    # where every layer slides: the largest window among the layers (a query at position p reads no key before
    # p + 1 - kv_window, so the KV cache may give back the blocks behind it: runtime.blocks.stale_blocks); None
    # where some layer reads every earlier position (no window, or Gemma's global layers)
    kv_window: int | None = None


@dataclass(frozen=True)
class TensorSpec:
    """One weight as a family expects it: `shape` in the Hugging Face layout; `kind`: "linear" (nn.Linear's
    (N, K), K the input), "conv1d" (GPT-2's Conv1D, (K, N)), "embedding" (V, C), "experts" (a mixture of
    experts' matrices, each (N, K), or their stack (E, N, K) as GGUF stores it: handed over as one row-major
    (E x N, K) stack, float or quantized, for `ops.expert_linear`) or "float32" (norms, biases, position tables:
    kept float32, in the stored layout)."""

    shape: tuple[int, ...]
    kind: TensorKind


@dataclass(frozen=True)
class Family:
    """A model family as the runtime sees it. `config_from_hf(config.json dict, where)` and
    `config_from_gguf(metadata, tensor names, where)` return the family's config (with a `.spec`), refusing
    what they do not support with one line naming the field; `tensors(cfg)` the weights by canonical name
    (Hugging Face's, prefixes such as "model." dropped by `canonical`), in load order; `canonical(key)` a
    checkpoint key's canonical name (None: a tensor the family ignores, e.g. rotary buffers); `gguf_names(cfg)`
    canonical -> GGUF name; `fusions(cfg)` (fused name, parts) pairs the loader concatenates along the output
    rows where the parts are stored alike (q, k, v -> qkv); `gguf_metadata(cfg)` the GGUF keys a converter writes,
    `gguf_architecture(cfg)` the `general.architecture` it writes (Mistral's is `llama`), `gguf_accepts(metadata)`
    whether a GGUF file of one of its architectures is its own (Mixtral's `llama` files, told from Llama's by
    their experts), `gguf_tensors(cfg)` the tensors it derives from the config (GGUF name -> float32 values:
    llama3's `rope_freqs`) and
    `to_gguf(cfg, name, float32 array)` a weight as llama.cpp stores it (`formats.gguf_writer`);
    `check(cfg, shapes, where)` the family's own checks of
    a checkpoint's tensors (by canonical name, HF layout) beyond "every expected tensor with its shape";
    `build(cfg, params, device, n_ctx)` the weights object (for a runtime context of n_ctx positions) whose
    `forward(batch, cache) -> logits` runs the model; `to_hf(cfg, name, float32 array)` a weight as the loaded model
    holds it back in the Hugging Face checkpoint's form (the inverse of what the config says was done to it: llama's
    Q/K rows of a GGUF file un-permuted; `loader.export_arrays`); `presets` named shapes (random weights, for
    benchmarks) as the config.json a published checkpoint of that shape carries; `examples` tiny config.json
    dicts, at least one per architecture the family registers, exercising its options (random checkpoints of
    them are what the conformance suite, tests/models/test_conformance.py, runs every path on)."""

    name: str
    hf_model_types: tuple[str, ...]
    gguf_architectures: tuple[str, ...]
    config_from_hf: Callable[[dict[str, Any], str], Any]
    config_from_gguf: Callable[[Mapping[str, Any], Sequence[str], str], Any]
    tensors: Callable[[Any], dict[str, TensorSpec]]
    canonical: Callable[[str], str | None]
    gguf_names: Callable[[Any], dict[str, str]]
    build: Callable[[Any, dict[str, Any], Any, int], Any]
    check: Callable[[Any, Mapping[str, tuple[int, ...]], str], None] = lambda cfg, shapes, where: None
    fusions: Callable[[Any], list[tuple[str, tuple[str, ...]]]] = lambda cfg: []
    gguf_metadata: Callable[[Any], dict[str, Any]] = lambda cfg: {}
    gguf_tensors: Callable[[Any], dict[str, list[float]]] = lambda cfg: {}
    gguf_architecture: Callable[[Any], str] = lambda cfg: str(cfg.spec.architecture)
    gguf_accepts: Callable[[Mapping[str, Any]], bool] = lambda meta: True
    to_gguf: Callable[[Any, str, Any], Any] = lambda cfg, name, arr: arr
    to_hf: Callable[[Any, str, Any], Any] = lambda cfg, name, arr: arr
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    examples: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
