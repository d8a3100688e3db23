"""What the bench builds on: `loader.export_arrays` (a loaded model's weights read back in the Hugging Face
layout) against the checkpoint and against transformers' own GGUF reader, on the CPU device and lavapipe; the
presets of every family against transformers' reading of the same config.json; `write_gguf` from a GGUF source."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from gpt2_fixtures import make_checkpoint  # noqa: E402
from llama_fixtures import make_llama  # noqa: E402

import webtensor as wt  # noqa: E402
from webtensor.formats.gguf_writer import write_gguf  # noqa: E402
from webtensor.models import loader, registry  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def hf_arrays(hf, family) -> dict[str, np.ndarray]:
    """An HF model's weights by webtensor's canonical names (float32)."""
    out = {}
    for key, t in hf.state_dict().items():
        name = family.canonical(key)
        if name is not None:
            out[name] = t.float().numpy()
    return out


@pytest.mark.parametrize("variant", ["qwen2", "qwen3", "llama-mha-bias"])
def test_export_arrays_of_a_checkpoint_directory(tmp_path, variant, device):
    """float32: the checkpoint's own tensors, bit for bit (q, k, v and gate, up split back out of the fused
    matrices, biases too); float16: the matrices and embeddings rounded to float16 (norms and biases stay float32)."""
    d = make_llama(tmp_path / variant, variant)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
    m = wt.load_model(d, device=device, dtype="float32")
    want = hf_arrays(hf, m.family)
    got = loader.export_arrays(m)
    assert set(got) == set(m.family.tensors(m.config)) and set(got) <= set(want)
    for name, arr in got.items():
        assert arr.dtype == np.float32 and np.array_equal(arr, want[name]), name
    if device.has_f16:
        half = loader.export_arrays(wt.load_model(d, device=device, dtype="float16"))
        specs = m.family.tensors(m.config)
        for name, arr in half.items():
            rounded = want[name] if specs[name].kind == "float32" else want[name].astype(np.float16).astype(np.float32)
            assert np.array_equal(arr, rounded), name


def test_export_arrays_of_gpt2(tmp_path, device):
    d = make_checkpoint(tmp_path / "gpt2", vocab_size=300, n_embd=64, n_layer=2, n_head=4, tie_word_embeddings=False)
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(d))
    m = wt.load_model(d, device=device, dtype="float32")
    want = hf_arrays(hf, m.family)
    for name, arr in loader.export_arrays(m).items():
        assert np.array_equal(arr, want[name]), name


@pytest.mark.parametrize("outtype", ["q8_0", "q4_0"])
def test_export_arrays_of_a_gguf_file_equal_transformers_reading(tmp_path, outtype, device):
    """A `llama` GGUF file (Q/K rows permuted by the converter, quantized blocks kept as stored on the device):
    read back, dequantized and un-permuted, the arrays equal what transformers' GGUF reader makes of the file."""
    d = make_llama(tmp_path / "src", "llama-gqa")
    gguf = write_gguf(d, tmp_path / f"m.{outtype}.gguf", outtype)
    m = wt.load_model(gguf, device=device)
    assert m.config.rope_interleaved
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=gguf.name, dtype=torch.float32)
    want = hf_arrays(hf, m.family)
    for name, arr in loader.export_arrays(m).items():
        np.testing.assert_allclose(arr, want[name], rtol=0, atol=1e-6, err_msg=name)


def test_write_gguf_from_a_gguf_file(tmp_path):
    """A GGUF source rewritten in another type (what `bench --llama-bench` does for dtype float32 on a quantized
    file): the rows keep llama.cpp's order (not permuted twice), so the new file's logits are the old one's
    dequantized."""
    d = make_llama(tmp_path / "src", "llama-gqa")
    q8 = write_gguf(d, tmp_path / "m.q8_0.gguf", "q8_0")
    f32 = write_gguf(q8, tmp_path / "m.f32.gguf", "f32")
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    want = wt.load_model(q8, device="cpu", dtype="float32").logits(ids)
    got = wt.load_model(f32, device="cpu").logits(ids)
    assert np.array_equal(got, want)
    assert wt.load_model(f32, device="cpu").encode("hello world") == wt.load_model(q8, device="cpu").encode(
        "hello world")


def _per_expert(state: dict[str, Any]) -> dict[str, Any]:
    """A model's state as its checkpoint names it: transformers 5 holds a mixture's experts fused in memory
    (`mlp.experts.gate_up_proj` (E, 2F, C), `mlp.experts.down_proj` (E, C, F)) where the files keep one matrix per
    expert (`mlp.experts.{e}.gate_proj.weight` ...)."""
    out: dict[str, Any] = {}
    for key, t in state.items():
        pre, fused, rest = key.partition("mlp.experts.")
        if not fused or rest not in ("gate_up_proj", "down_proj"):
            out[key] = t
            continue
        for e in range(t.shape[0]):
            if rest == "down_proj":
                out[f"{pre}mlp.experts.{e}.down_proj.weight"] = t[e]
            else:
                half = t.shape[1] // 2
                out[f"{pre}mlp.experts.{e}.gate_proj.weight"] = t[e, :half]
                out[f"{pre}mlp.experts.{e}.up_proj.weight"] = t[e, half:]
    return out


@pytest.mark.parametrize("name", sorted(registry.presets()))
def test_presets_are_what_transformers_reads(name):
    """Each preset's config.json read by transformers gives a model whose every weight is one webtensor's family
    expects, with its shape; the sizes agree; Llama-family rotary frequencies (llama3 scaling included) are HF's to
    within an ulp."""
    family, cfg, raw = registry.preset(name)
    raw = dict(raw)
    hf_cfg = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    specs = family.tensors(cfg)
    shapes = {family.canonical(k): tuple(t.shape) for k, t in _per_expert(hf.state_dict()).items()}
    shapes = {k: v for k, v in shapes.items() if k is not None}
    if cfg.spec.architecture != "gpt2" and cfg.tie_word_embeddings and "lm_head.weight" in shapes:
        shapes.pop("lm_head.weight")  # (HF lists the tied head under its own name too)
    if cfg.spec.architecture == "gpt2":
        shapes.pop("lm_head.weight")
    assert shapes == {k: s.shape for k, s in specs.items()}
    s = cfg.spec
    assert (s.n_layer, s.vocab_size, s.n_ctx) == (hf_cfg.num_hidden_layers, hf_cfg.vocab_size,
                                                  hf_cfg.max_position_embeddings)
    if hasattr(cfg, "rope"):  # a decoder family (HF's rotary class, built on the CPU: its inv_freq per layer type)
        from webtensor.models.decoder.rope import inv_freq

        rotary = type(hf.model.rotary_emb)(hf_cfg)
        ropes = {"": cfg.rope} if hasattr(rotary, "inv_freq") else \
            {"full_attention_": cfg.rope, "sliding_attention_": cfg.rope_local or cfg.rope}
        for prefix, rope in ropes.items():
            want = getattr(rotary, f"{prefix}inv_freq").numpy()
            # (within one float32 ulp: webtensor's base ** (i / dim) is rounded from double precision, torch's is
            # float32's pow; for qwen3-0.6b one of 64 frequencies differs by an ulp)
            np.testing.assert_array_max_ulp(np.asarray(inv_freq(rope, cfg.head_dim), np.float32), want, maxulp=1)
