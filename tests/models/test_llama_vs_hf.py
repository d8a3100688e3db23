"""The Llama family (llama, mistral, qwen2, qwen3) against Hugging Face transformers on the same weights: random
checkpoints written by transformers itself, in both config.json layouts, every option (GQA, MQA, MHA, tied head,
biases, llama3 and linear rope scaling, QK-norm, explicit head_dim), sharded and in float16 / bfloat16 files; the
same checkpoints as GGUF files (webtensor's writer, llama.cpp's layout) in every float and quantized type, read by
webtensor and by transformers; and what is refused, with the field named."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from conftest import rel_err  # noqa: E402
from llama_fixtures import VARIANTS, make_llama  # noqa: E402

import webtensor as wt  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

IDS = [int(i) for i in np.random.default_rng(7).integers(0, 4096, 23)]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llama")
    out = {v: make_llama(root / v, v) for v in VARIANTS}
    out["llama3-rope-legacy"] = make_llama(root / "legacy", "llama3-rope", legacy_rope=True)
    out["llama-gqa-legacy"] = make_llama(root / "legacy-default", "llama-gqa", legacy_rope=True)
    return out


def hf_logits(path: Path, ids: list[int], **kw: object) -> np.ndarray:
    m = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, **kw).eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].numpy()


def hf_greedy(path: Path, ids: list[int], n: int, **kw: object) -> list[int]:
    m = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, **kw).eval()
    with torch.no_grad():
        out = m.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("variant", [*VARIANTS, "llama3-rope-legacy", "llama-gqa-legacy"])
def test_float32_logits_and_greedy_match_hf_on_cpu(ckpts, variant):
    path = ckpts[variant]
    m = wt.load_model(path, "cpu", "float32")
    assert m.spec.family == "llama" and m.spec.architecture == VARIANTS[variant.removesuffix("-legacy")][0]
    assert rel_err(m.logits(IDS), hf_logits(path, IDS)) <= 1e-5
    assert m.generate(IDS[:6], 12, stop_at_eos=False) == hf_greedy(path, IDS[:6], 12)


@pytest.mark.wgpu
@pytest.mark.parametrize("variant", ["llama-gqa", "llama-mqa-tied", "llama3-rope", "qwen2", "qwen3", "qwen3-hd128"])
def test_float32_logits_and_greedy_match_hf_on_lavapipe(ckpts, gpu, variant):
    path = ckpts[variant]
    m = wt.load_model(path, gpu, "float32", kv_dtype="float32")
    assert rel_err(m.logits(IDS), hf_logits(path, IDS)) <= 1e-5
    assert m.generate(IDS[:6], 12, stop_at_eos=False) == hf_greedy(path, IDS[:6], 12)  # the captured decode step


def test_sharded_and_half_precision_files(ckpts, tmp_path):
    """Shards in float16 and bfloat16, as published checkpoints come: the same model as transformers reads."""
    src = transformers.AutoModelForCausalLM.from_pretrained(str(ckpts["qwen2"]))
    for dtype in (torch.float16, torch.bfloat16):
        d = tmp_path / str(dtype)
        src.to(dtype).save_pretrained(d, max_shard_size="200KB")
        assert len(list(d.glob("*.safetensors"))) > 1
        for f in ("tokenizer.json", "tokenizer_config.json"):
            (d / f).write_bytes((ckpts["qwen2"] / f).read_bytes())
        m = wt.load_model(d, "cpu", "float32")
        assert rel_err(m.logits(IDS), hf_logits(d, IDS)) <= 1e-5


def test_generation_config_eos_list(ckpts, tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    for f in ckpts["llama-gqa"].iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    free = wt.load_model(d, "cpu").generate(IDS[:6], 10, stop_at_eos=False)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, free[4]]}))
    m = wt.load_model(d, "cpu")
    assert free[4] in m.eos_ids and 0 in m.eos_ids
    assert m.generate(IDS[:6], 10) == free[:free.index(free[4]) + 1]


GGUF_TYPES = {"f32": 1e-5, "f16": 2e-3, "bf16": 2e-3, "q8_0": 2e-3, "q4_0": 2e-3, "q4_1": 2e-3}


@pytest.fixture(scope="module")
def ggufs(ckpts, tmp_path_factory) -> dict[tuple[str, str], Path]:
    from webtensor.formats.gguf_writer import write_gguf

    root = tmp_path_factory.mktemp("gguf")
    return {(v, t): write_gguf(ckpts[v], root / f"{v}.{t}.gguf", t)
            for v in ("llama-gqa", "llama-mqa-tied", "qwen2", "qwen3-hd128") for t in GGUF_TYPES}


@pytest.mark.parametrize("variant", ["llama-gqa", "llama-mqa-tied", "qwen2", "qwen3-hd128"])
@pytest.mark.parametrize("outtype", list(GGUF_TYPES))
def test_gguf_matches_transformers_reading_the_same_file(ggufs, variant, outtype):
    """llama.cpp's layout (Q/K rows permuted for `llama`, run with interleaved rope as stored), the quantized
    blocks kept as they are; transformers dequantizes and un-permutes the same file."""
    f = ggufs[(variant, outtype)]
    m = wt.load_model(f, "cpu")
    kw = dict(gguf_file=f.name)
    want = hf_logits(f.parent, IDS, **kw)
    assert rel_err(m.logits(IDS), want) <= GGUF_TYPES[outtype]
    assert m.generate(IDS[:6], 10, stop_at_eos=False) == hf_greedy(f.parent, IDS[:6], 10, **kw)


@pytest.mark.wgpu
@pytest.mark.parametrize("outtype", ["q8_0", "q4_0", "q4_1", "f16"])
def test_gguf_on_lavapipe_equals_the_cpu(ggufs, gpu, outtype):
    f = ggufs[("qwen2", outtype)]
    cpu, gp = wt.load_model(f, "cpu"), wt.load_model(f, gpu)
    assert rel_err(gp.logits(IDS), cpu.logits(IDS)) <= 1e-4
    assert gp.generate(IDS[:6], 10, stop_at_eos=False) == cpu.generate(IDS[:6], 10, stop_at_eos=False)


def _edit_config(src: Path, dst: Path, **changes: object) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(("variant", "changes", "match"), [
    ("qwen2", dict(use_sliding_window=True), "use_sliding_window = true: sliding-window attention"),
    ("mistral", dict(sliding_window=64), "sliding_window = 64: sliding-window attention is not supported"),
    ("llama-gqa", dict(rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=1e4)), "rope_type 'yarn'"),
    ("llama-gqa", dict(rope_parameters=None, rope_scaling=dict(type="dynamic", factor=2.0)), "rope_type 'dynamic'"),
    ("llama-gqa", dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
    ("llama-gqa", dict(num_key_value_heads=3), "not a multiple of num_key_value_heads = 3"),
    ("llama-gqa", dict(model_type="falcon"), "model_type 'falcon' is not supported"),
    ("llama-gqa", dict(intermediate_size=80),
     r"'layers.0.mlp.gate_proj.weight' has shape \(96, 64\), expected \(80, 64\)"),
    ("llama-gqa", dict(num_hidden_layers=3), "'layers.2.input_layernorm.weight' is missing"),
    ("llama-gqa", dict(quantization_config={"quant_method": "gptq"}), "quantization_config is set"),
])
def test_unsupported_configs_refused_with_the_field_named(ckpts, tmp_path, variant, changes, match):
    d = _edit_config(ckpts[variant], tmp_path / "c", **changes)
    with pytest.raises(wt.CheckpointError, match=match) as e:
        wt.load_model(d, "cpu")
    assert "\n" not in str(e.value)
