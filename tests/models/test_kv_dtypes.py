"""The KV cache's types (docs/design-kv.md, docs/numerics.md) against Hugging Face transformers' float32 on the same
weights: logits within each type's documented tolerance (float32 1e-5, float16 1e-3, q8_0 2e-2, norm-wise relative),
the same greedy tokens for float32 and float16 on the test prompts, the CPU reference and WebGPU (lavapipe) agreeing
to a step of the type; the default type per device; what is refused."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from conftest import rel_err  # noqa: E402
from llama_fixtures import make_llama  # noqa: E402

import webtensor as wt  # noqa: E402

IDS = [int(i) for i in np.random.default_rng(7).integers(0, 4096, 23)]
TOL = {"float32": 1e-5, "float16": 1e-3, "q8_0": 2e-2}  # docs/numerics.md: "The KV cache's types"
# the CPU reference against WebGPU: their float32 keys and values differ in the last bits, which can store a value as
# the neighbouring one of its type (a float16 ulp, a q8_0 step)
DEVICES_TOL = {"float32": 1e-5, "float16": 1e-4, "q8_0": 1e-3}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("kv")
    return {v: make_llama(root / v, v) for v in ("llama-gqa", "qwen3-hd128")}  # head dims 16 and 128


@pytest.mark.hf
@pytest.mark.parametrize("kv", ["float32", "float16", "q8_0"])
@pytest.mark.parametrize("variant", ["llama-gqa", "qwen3-hd128"])
def test_logits_and_greedy_tokens_against_transformers(ckpts, gpu, variant, kv):
    torch = pytest.importorskip("torch")
    import transformers

    path = ckpts[variant]
    if kv == "q8_0" and variant == "llama-gqa":  # (a head dim of 16 is no whole q8_0 block)
        with pytest.raises(wt.ArgumentError, match="q8_0 needs a head dim that is a multiple of 32"):
            wt.load_model(path, "cpu", "float32", kv_dtype=kv)
        return
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(torch.tensor([IDS])).logits[0].numpy()
        greedy = hf.generate(torch.tensor([IDS[:6]]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                             pad_token_id=0)[0, 6:].tolist()
    got = []
    for dev in ("cpu", gpu):
        m = wt.load_model(path, dev, "float32", kv_dtype=kv)
        assert m.kv_dtype == kv
        logits = m.logits(IDS)  # (the prompt's keys and values stored in the pool's type, attended as stored)
        assert rel_err(logits, want) <= TOL[kv]
        tokens = m.generate(IDS[:6], 12, stop_at_eos=False)  # (the captured decode steps)
        if kv != "q8_0":
            assert tokens == greedy
        got.append(logits)
    assert rel_err(got[1], got[0]) <= DEVICES_TOL[kv]


@pytest.mark.wgpu
def test_default_kv_dtype_per_device(gpu):
    """float16 where the device's kernels read float16 (a WebGPU adapter with shader-f16), float32 on the CPU
    reference and on an adapter without the feature; float16 asked for there is refused with the reason."""
    assert wt.load_model(None, "cpu").kv_dtype == "float32"
    assert wt.load_model(None, gpu).kv_dtype == ("float16" if gpu.has_f16 else "float32")
    plain = wt.Device.wgpu(features=())
    m = wt.load_model(None, plain)
    assert m.kv_dtype == "float32"
    with pytest.raises(wt.ArgumentError, match="kv_dtype float16: this device has no shader-f16 feature"):
        m.kv_dtype = "float16"
    with pytest.raises(wt.ArgumentError, match="kv_dtype must be one of float32, float16, q8_0, got 'int4'"):
        wt.load_model(None, "cpu", kv_dtype="int4")


def test_kv_memory_follows_the_pool(device):
    """A runner's pool holds what it is given: bytes a position from the model's shape and KV type, the pool's
    size in blocks of 16; the default runner of `generate` holds one whole context, in the model's type."""
    m = wt.load_model(None, device, kv_dtype="float32")
    s = m.spec
    assert m.position_bytes() == 2 * s.n_layer * s.n_kv_head * s.head_dim * 4
    r = m.runner(2, kv_blocks=5)
    assert r.cache.positions == 5 * 16 and r.cache.nbytes == 2 * s.n_layer * 6 * 16 * s.n_kv_head * s.head_dim * 4
    assert m.runner(1).cache.positions == -(-m.n_ctx // 16) * 16
    assert "KV float32" in m.describe() and f"{m.n_ctx:,} positions" in m.describe()
