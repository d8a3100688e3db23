"""The mixture-of-experts family beyond the conformance suite (which runs every path on its tiny examples):
options the examples leave out (Qwen3-MoE not renormalized, with `decoder_sparse_step`; the transformers 5 and
published config.json keys for the expert count) against transformers; GGUF files whose stacked expert tensors
stay quantized (`ffn_*_exps` in q4_0 / q4_1 / q8_0, and random Q4_K / Q6_K blocks through the writer's
`tensor_types`) against the same file dequantized at load, on the CPU and lavapipe; a GGUF `llama` file told
apart as Llama's or Mixtral's by its experts; and the one-line refusals."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from conftest import set_policy  # noqa: E402
from tolerance import assert_close  # noqa: E402

import webtensor as wt  # noqa: E402
from webtensor import quant  # noqa: E402
from webtensor.formats.gguf_writer import write_gguf  # noqa: E402
from webtensor.models import registry  # noqa: E402
from webtensor.quant.types import Quantized  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "webtensor" / "models" / "shipped"
IDS = [int(i) for i in np.random.default_rng(3).integers(0, 4096, 19)]
FAMILY = registry.by_name("moe")


def _checkpoint(d: Path, raw: dict[str, Any]) -> Path:
    raw = dict(raw)
    torch.manual_seed(1)
    cfg = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(p + 0.2 * torch.randn_like(p))
    model.save_pretrained(d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SHIPPED / f, d / f)
    return d


def _hf_logits(d: Path) -> np.ndarray:
    m = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.tensor([IDS])).logits[0].numpy()


def test_qwen3_moe_without_renormalization_and_with_a_sparse_step(tmp_path):
    """norm_topk_prob false, every second layer sparse (decoder_sparse_step 2), 3 layers."""
    raw = {**FAMILY.examples["qwen3_moe"], "norm_topk_prob": False, "decoder_sparse_step": 2, "mlp_only_layers": [],
           "num_hidden_layers": 3}
    d = _checkpoint(tmp_path / "hf", raw)
    m = wt.load_model(d, "cpu", "float32", n_ctx=64)
    assert m.config.sparse == (False, True, False) and not m.config.norm_topk_prob
    assert_close(m.logits(IDS), _hf_logits(d), rtol=1e-5)


def test_the_expert_count_under_each_of_its_names():
    base = dict(FAMILY.examples["olmoe"])
    del base["num_experts"]
    assert FAMILY.config_from_hf({**base, "num_local_experts": 6}, "c").num_experts == 6  # (transformers 5 saves)
    assert FAMILY.config_from_hf({**base, "num_experts": 9}, "c").num_experts == 9  # (published files)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("moe") / "qwen3_moe", FAMILY.examples["qwen3_moe"])


@pytest.mark.parametrize("outtype", ["q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("dev", ["cpu", pytest.param("lavapipe", marks=pytest.mark.wgpu)])
def test_quantized_stacked_experts_equal_the_file_dequantized(qwen_dir, tmp_path, outtype, dev):
    path = write_gguf(qwen_dir, tmp_path / f"m.{outtype}.gguf", outtype)
    q = wt.load_model(path, dev, None, n_ctx=64)
    stack = q.params["layers.0.mlp.experts.gate_proj.weight"]
    assert isinstance(stack, Quantized) and stack.qtype == outtype.upper() and stack.shape == (7 * 32, 64)
    f32 = wt.load_model(path, dev, "float32", n_ctx=64)
    assert_close(q.logits(IDS), f32.logits(IDS), rtol=1e-5)
    assert q.generate(IDS[:5], 6, stop_at_eos=False) == f32.generate(IDS[:5], 6, stop_at_eos=False)


@pytest.mark.wgpu
def test_prompt_chunks_through_the_grouped_kernels_match_transformers(qwen_dir, gpu, monkeypatch):
    """GPU-style kernels on lavapipe with the grouped expert products for every prompt chunk (moe_align +
    expert_gemm, 4-slot blocks): logits and greedy tokens as transformers', decode rows still bit for bit
    alone or in a batch (they stay one-row products)."""
    set_policy(monkeypatch, gpu, gpu_style=True, moe_grouped_min_slots=0, moe_block=8)
    ran: list[str] = []
    real = gpu.ctx.kernel
    monkeypatch.setattr(gpu.ctx, "kernel", lambda file, *a, **kw: ran.append(file) or real(file, *a, **kw))
    m = wt.load_model(qwen_dir, gpu, "float32", n_ctx=64, kv_dtype="float32")
    want = _hf_logits(qwen_dir)
    assert_close(m.logits(IDS), want, rtol=1e-5)
    assert "moe_align" in ran and "expert_gemm" in ran
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(qwen_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        greedy = hf.generate(torch.tensor([IDS[:6]]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                             pad_token_id=0)[0, 6:].tolist()
    assert m.generate(IDS[:6], 8, stop_at_eos=False) == greedy


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("dev", ["cpu", pytest.param("lavapipe", marks=pytest.mark.wgpu)])
def test_k_quant_stacked_experts_equal_the_file_dequantized(tmp_path, qtype, dev):
    """Q4_K_M-style experts (K-quant stacks of 256-value blocks) read as stored, against the same file dequantized
    at load."""
    raw = {**FAMILY.examples["qwen3_moe"], "hidden_size": 256, "moe_intermediate_size": 256, "intermediate_size": 256,
           "head_dim": 64, "num_hidden_layers": 2}
    d = _checkpoint(tmp_path / "hf", raw)
    rng = np.random.default_rng(5)  # (random blocks with finite float16 scales: K-quants webtensor does not make)
    path = write_gguf(d, tmp_path / f"{qtype}.gguf", "f32", tensor_types={"_exps": qtype},
                      kquant_blocks=lambda t, n, k: quant.random_weight(t, (n, k), rng).blocks)
    q = wt.load_model(path, dev, None, n_ctx=64)
    assert q.params["layers.0.mlp.experts.down_proj.weight"].qtype == qtype
    f32 = wt.load_model(path, dev, "float32", n_ctx=64)
    assert_close(q.logits(IDS), f32.logits(IDS), rtol=1e-5)
    assert q.generate(IDS[:5], 6, stop_at_eos=False) == f32.generate(IDS[:5], 6, stop_at_eos=False)


PAGE = r"""
import asyncio, json, sys
sys.modules["numpy"] = None  # the page (Pyodide) has no numpy: any import of it fails
from webtensor.device import Device
from webtensor.web import app

app._state["device"] = Device.wgpu()
info = json.loads(asyncio.run(app.load_model(sys.argv[1], None, "Q4_0")))
greedy = json.loads(asyncio.run(app.generate(sys.argv[2], "6", "0", "")))
print(json.dumps(dict(info=info, greedy=greedy, numpy=sys.modules["numpy"] is not None)))
"""


@pytest.mark.wgpu
def test_the_page_runs_a_quantized_mixture_of_experts_without_numpy(qwen_dir, tmp_path, gpu):
    """The page's entry points (`web.app`, pure-Python readers, no numpy) on a q4_0 GGUF file of the Qwen3-MoE
    example: its stacked experts uploaded from the file's bytes, the same greedy tokens as natively."""
    import json
    import subprocess

    path = write_gguf(qwen_dir, tmp_path / "moe.q4_0.gguf", "q4_0")
    prompt = "It is a truth universally acknowledged"
    run = subprocess.run([sys.executable, "-c", PAGE, str(path), prompt], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["numpy"] is False and got["info"]["architecture"] == "qwen3_moe"
    native = wt.load_model(path, gpu, None)
    ids = native.encode(prompt)
    assert got["greedy"]["prompt_ids"] == ids
    assert got["greedy"]["token_ids"] == native.generate(ids, 6)


def test_a_llama_gguf_file_is_mixtrals_when_it_has_experts():
    assert registry.for_gguf("llama", "f", {"general.architecture": "llama", "llama.expert_count": 8}).name == "moe"
    assert registry.for_gguf("llama", "f", {"general.architecture": "llama"}).name == "llama"
    assert registry.for_gguf("qwen3moe", "f", {"general.architecture": "qwen3moe"}).name == "moe"
    assert registry.for_gguf("llama", "f").name == "llama" and registry.for_gguf("olmoe", "f").name == "moe"


@pytest.mark.parametrize(("change", "message"), [
    ({"model_type": "mixtral", "sliding_window": 64}, "sliding_window = 64: sliding-window attention is not supported"),
    ({"model_type": "qwen3_moe", "use_sliding_window": True}, "use_sliding_window = true"),
    ({"model_type": "olmoe", "clip_qkv": 8.0}, "clip_qkv = 8.0: clipping q, k, v is not supported"),
    ({"model_type": "olmoe", "num_experts_per_tok": 6}, "num_experts_per_tok = 6 must be in 1 .. num_experts = 5"),
    ({"model_type": "olmoe", "attention_bias": True}, "attention_bias = true is not supported for olmoe"),
    ({"model_type": "qwen3_moe", "decoder_sparse_step": 0}, "decoder_sparse_step must be a positive integer"),
])
def test_unsupported_configs_are_refused_in_one_line(change, message):
    base = {"olmoe": FAMILY.examples["olmoe"], "mixtral": FAMILY.examples["mixtral"],
            "qwen3_moe": FAMILY.examples["qwen3_moe"]}[change["model_type"]]
    with pytest.raises(wt.CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        FAMILY.config_from_hf({**base, **change}, "config.json")
    assert "\n" not in str(e.value)


def test_bench_compare_runs_hf_alone_where_no_torch_step_is_written():
    from webtensor.bench.torch_step import has_torch_step

    assert [has_torch_step(t) for t in ("qwen3_moe", "mixtral", "olmoe")] == [False] * 3
    assert has_torch_step("qwen3") and has_torch_step("gpt2")
