"""Every family and the newer GGUF types in the page, in one page session whose model menu switches between them
(Pyodide, the pure-Python readers, no numpy, the browser's WebGPU):

- every example of the conformance suite (`Family.examples`: GPT-2, Llama, Mistral, Ministral, Qwen2 / 3, Phi-3,
  Granite, Gemma 1 / 2 / 3, OLMo-2, Qwen3-MoE, Mixtral, OLMoE; random weights written by transformers): its greedy
  tokens are transformers';
- a random Llama-shaped GGUF file holding the K-quant and IQ4 types (Q5_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS: rows of
  whole 256-value blocks; the embedding and the LM head quantized too), its blocks uploaded as stored (cut into the
  GPU layout by the pure-Python code): the native model's tokens on lavapipe and on the CPU device;
- the Qwen3-MoE example again on a second device of the page with the GPU kernels (the policy's gpu_style: the
  prompt's experts through moe_align and the grouped expert_gemm, subgroup reductions), as a browser on a real GPU
  runs it: transformers' tokens, and the native model's on lavapipe with the same policy.

Needs what tests/web/test_browser.py needs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import webtensor as wt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "models"))
from conftest import set_policy  # noqa: E402
from llama_fixtures import make_llama  # noqa: E402
from test_browser import _need_browser  # noqa: E402
from test_conformance import EXAMPLES, IDS, NEW, _Example  # noqa: E402

pytestmark = pytest.mark.hf  # transformers writes the checkpoints (each test is marked browser too)

# the GGUF file's matrices and their types (by the part of the GGUF name): the five newer types, each in the
# products of a layer, IQ4_XS also gathered by the embedding and Q2_K the LM head's
KQUANT_TYPES = {"token_embd": "IQ4_XS", "attn_q": "Q5_K", "attn_k": "Q3_K", "attn_v": "IQ4_NL", "attn_output": "Q2_K",
                "ffn_gate": "IQ4_XS", "ffn_up": "Q5_K", "ffn_down": "Q3_K", "output": "Q2_K"}
KQUANT_PROMPT = IDS  # (21 tokens: the prompt's products through the tiled kernel, each token's through the GEMV)
# the page's model: its greedy tokens, and each weight's kind (class and stored type) in layer 0, the embedding and
# the head
PAGE_RUN = """
import json, sys
from webtensor.quant.types import TYPES
from webtensor.web import app
m = app._state["model"]
w = m.weights
attn, mlp = (w.attns[0], w.mlps[0]) if hasattr(w, "attns") else (None, None)  # (a decoder's; GPT-2's are its own)
parts = dict(getattr(attn, "__dict__", {}), **getattr(mlp, "__dict__", {}), embed=getattr(w, "embed", None),
             head=getattr(w, "head", None))
kinds = {n: f"{type(x).__name__} {getattr(x, 'qtype', '')}".strip() for n, x in parts.items() if x is not None}
greedy = m.generate(IDS, NEW, stop_at_eos=False)
built = {f"{file} {k}" for file, defines in m.device.ctx._pipelines for k, _ in defines if k in TYPES}
json.dumps(dict(architecture=m.spec.architecture, greedy=greedy, kinds=kinds, quant_kernels=sorted(built),
                mlps=[type(x).__name__ for x in getattr(w, "mlps", [])], numpy="numpy" in sys.modules))
"""
MOE = ("moe", "qwen3_moe")
# the page's model file loaded again on a second device of the page whose policy picks the GPU kernels
GPU_STYLE = dict(gpu_style=True, moe_grouped_min_slots=8)  # (the prompt's 18 (row, expert) slots grouped)
PAGE_GPU_STYLE = """
import glob, json, time
from webtensor.device import Device
from webtensor.models import load_model
dev = await Device.wgpu_async(features=("subgroup",))  # (a device of its own: not the page's)
dev.kernel_policy = dev.kernel_policy.replace(**POLICY)
t0 = time.perf_counter()
m = load_model(glob.glob("/home/pyodide/models/MODEL_ID/*")[0], dev, "float32", reader="pure")
json.dumps(dict(greedy=m.generate(IDS, NEW, stop_at_eos=False), s=time.perf_counter() - t0,
                distinct=dev is not await Device.wgpu_async(), policy=str(dev.kernel_policy),
                kernels=sorted({file for file, _ in dev.ctx._pipelines})))
"""


def _page_code(code: str, **more: Any) -> str:
    for key, value in (dict(IDS=repr(IDS[:6]), NEW=str(NEW)) | more).items():
        code = code.replace(key, value)
    return code


def write_kquant_gguf(root: Path) -> Path:
    """A random Llama-shaped checkpoint (transformers') written as GGUF with KQUANT_TYPES' types (random blocks of a
    model's scale, `quant.weight.MODEL_LOG2_SCALE`), rows of whole 256-value blocks."""
    from webtensor import quant
    from webtensor.formats.gguf_writer import write_gguf
    from webtensor.quant.weight import MODEL_LOG2_SCALE

    hf = make_llama(root / "hf", "llama-gqa", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2)
    rng = np.random.default_rng(0)
    return write_gguf(hf, root / "llama-kquants.gguf", "q2_k",
                      tensor_types={rf"(^|\.){name}\.": t for name, t in KQUANT_TYPES.items()},
                      kquant_blocks=lambda t, n, k: quant.random_weight(t, (n, k), rng, MODEL_LOG2_SCALE[t]).blocks)



@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[Any, Any]:
    """Each conformance example's checkpoint (by (family, example)), and the GGUF file of the newer types."""
    root = tmp_path_factory.mktemp("web-families")
    return {e: _Example(*e, root) for e in EXAMPLES} | {"kquants": write_kquant_gguf(root / "kquants")}


@pytest.fixture(scope="module")
def page(models: dict[Any, Any]) -> dict[str, Any]:
    """One page session: each example in turn, picked in the model menu (the first at boot), then the GGUF file,
    then the MoE example again on a second device with the GPU kernels."""
    _need_browser()
    from webtensor.web.headless import run_page
    from webtensor.web.server import WebApp

    sources = [models[e].hf_dir for e in EXAMPLES] + [models["kquants"]]
    ids = dict(zip([*EXAMPLES, "kquants"], WebApp(sources).models, strict=False))  # (the menu's ids: the server's)
    tasks: list[dict[str, Any]] = []
    for name in [*EXAMPLES, "kquants"]:
        label = name if isinstance(name, str) else name[1]
        if tasks:  # (the first is the boot's)
            tasks.append(dict(type="model", name=f"to-{label}", model=ids[name]))
        prompt = KQUANT_PROMPT if name == "kquants" else IDS[:6]
        tasks.append(dict(type="python", name=label, code=_page_code(PAGE_RUN, IDS=repr(prompt))))
    tasks.append(dict(type="python", name="moe-gpu-style", code=_page_code(
        PAGE_GPU_STYLE, MODEL_ID=ids[MOE], POLICY=repr(GPU_STYLE))))
    out = run_page(tasks, sources, timeout_s=400, query=f"?model={ids[EXAMPLES[0]]}&dtype=float32")
    if out.get("error"):
        pytest.fail(f"the browser session failed: {out['error']}\n" + "\n".join(out.get("console", [])[-20:]))
    print(f"\nbrowser (ms): boot {out['ms']['boot']}, " + ", ".join(f"{t['name']} {t['ms']}" for t in out["tasks"]))
    got = {t["name"]: t for t in out["tasks"]}
    for t in got.values():
        assert not t.get("error"), f"{t['name']}: {t['error']}"
    return {name: json.loads(t["results"]) if t["type"] == "python" else t for name, t in got.items()} | dict(
        boot=out["boot"])


@pytest.mark.browser
@pytest.mark.parametrize("example", EXAMPLES, ids=[e[1] for e in EXAMPLES])
def test_page_runs_every_family(page, models, example):
    """Each example, picked in the model menu, in float32 on the page's device: transformers' greedy tokens."""
    ex = models[example]
    got = page[example[1]]
    assert (got["architecture"], got["greedy"], got["numpy"]) == (ex.raw["model_type"], ex.hf_greedy, False)
    if example != EXAMPLES[0]:
        switched = page[f"to-{example[1]}"]
        assert switched["model"]["dtype"] == "float32" and switched["model"]["device"] == "webgpu"


@pytest.mark.browser
def test_page_runs_the_k_quant_and_iq4_types(page, models, gpu):
    """The GGUF file of Q5_K, Q3_K, Q2_K, IQ4_NL and IQ4_XS matrices (every tensor its chosen type), picked in the
    model menu: every weight on the GPU in its stored type (QuantGpu), and greedy tokens after a prompt of 21 (its
    products tiled, each new token's a GEMV) equal to the native model's on lavapipe and on the CPU device."""
    import gguf

    path = models["kquants"]
    stored = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert {n: t for n, t in stored.items() if t != "F32"} == {
        n: KQUANT_TYPES[n.split(".")[-2]] for n in stored if stored[n] != "F32"}
    assert set(KQUANT_TYPES.values()) == {"Q5_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS"}
    switched = page["to-kquants"]
    assert switched["model"]["format"] == "gguf" and switched["model"]["architecture"] == "llama"
    got = page["kquants"]
    assert got["numpy"] is False and got["architecture"] == "llama"
    assert got["kinds"] == {"q": "QuantGpu Q5_K", "k": "QuantGpu Q3_K", "v": "QuantGpu IQ4_NL", "o": "QuantGpu Q2_K",
                            "gate": "QuantGpu IQ4_XS", "up": "QuantGpu Q5_K", "down": "QuantGpu Q3_K",
                            "embed": "QuantGpu IQ4_XS", "head": "QuantGpu Q2_K"}
    for t in set(KQUANT_TYPES.values()):  # (the page's device: the CPU adapter's kernels)
        assert {f"gemv_quant {t}", f"matmul_quant_regs {t}"} <= set(got["quant_kernels"]), t
    assert "embedding_quant IQ4_XS" in got["quant_kernels"]
    want = wt.load_model(path, "cpu").generate(KQUANT_PROMPT, NEW, stop_at_eos=False)
    assert got["greedy"] == want
    assert wt.load_model(path, gpu).generate(KQUANT_PROMPT, NEW, stop_at_eos=False) == want
    assert len(set(want)) > 2  # (a model that says something: not one token over and over)


@pytest.mark.browser
def test_page_runs_a_mixture_of_experts_with_the_gpu_kernels(page, models, gpu, monkeypatch):
    """The Qwen3-MoE example on a second device of the page whose policy picks the GPU kernels (grouped experts for
    the prompt, the expert GEMV for each token): transformers' greedy tokens, which the native model on lavapipe
    with the same policy also gives (and the page's own device, test_page_runs_every_family)."""
    moe = models[MOE]
    assert page[MOE[1]]["mlps"][0] != page[MOE[1]]["mlps"][1]  # (layer 1 dense: mlp_only_layers)
    styled = page["moe-gpu-style"]
    assert styled["distinct"] and "gpu_style=True" in styled["policy"]
    assert {"moe_align", "expert_gemm", "expert_gemv", "moe_route"} <= set(styled["kernels"])
    assert styled["greedy"] == moe.hf_greedy
    set_policy(monkeypatch, gpu, **GPU_STYLE)
    assert wt.load_model(moe.hf_dir, gpu, "float32").generate(IDS[:6], NEW, stop_at_eos=False) == moe.hf_greedy
    print(f"\nQwen3-MoE in the page with the GPU kernels: loaded and 8 tokens in {styled['s']:.1f} s")
