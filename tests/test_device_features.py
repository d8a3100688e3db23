"""Devices as adapters come: without optional features, with any binding limit, one per adapter.

- Every kernel builds and runs with `subgroup` and `shader-f16` withheld (`Device.wgpu(features=)`),
  in the CPU-adapter variants and (the kernel policy's gpu_style) in the GPU variants: GPT-2 gives the
  CPU reference's tokens.
- Any `max_binding_bytes` works: every op gives the reference's result (operands and results over
  it a block of rows at a time), or a clear BufferLimitError where one row is over it by itself.
- However it is asked for, one adapter is one Device, so tensors mix.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import set_policy
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tolerance import assert_close, layer_norm_scale, linear_scale

import webtensor as wt
from webtensor.models.gpt2 import GPT2

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return GPT2.from_pretrained(None, device="cpu").encode("It was a bright cold day in April, and")


@pytest.fixture(scope="module")
def cpu_tokens(prompt: list[int]) -> list[int]:
    return GPT2.from_pretrained(None, device="cpu").generate(prompt, 24, stop_at_eos=False)


@pytest.mark.parametrize("features", [(), ("subgroup",), ("shader-f16",)], ids=["none", "subgroup", "f16"])
@pytest.mark.parametrize("gpu_style", [False, True], ids=["cpu-kernels", "gpu-kernels"])
def test_gpt2_on_a_device_without_optional_features(features, gpu_style, prompt, cpu_tokens, monkeypatch):
    dev = wt.Device.wgpu(software=True, features=features)
    set_policy(monkeypatch, dev, gpu_style=gpu_style)
    assert dev.has_subgroups == ("subgroup" in features and "subgroup" in dev.ctx.api.info.features)
    assert dev.has_f16 == ("shader-f16" in features and "shader-f16" in dev.ctx.api.info.features)
    assert not set(dev.ctx.api.features) - set(features)
    m = GPT2.from_pretrained(None, device=dev)
    assert m.generate(prompt, 24, stop_at_eos=False) == cpu_tokens
    if not dev.has_f16:
        with pytest.raises(wt.CheckpointError, match="shader-f16"):
            GPT2.from_pretrained(None, device=dev, dtype="float16")
        with pytest.raises(wt.DTypeError, match="shader-f16"):
            wt.tensor(np.ones(3, np.float32), device=dev).to("float16")


def test_one_device_per_adapter():
    a = wt.Device.wgpu()
    assert wt.Device.parse("wgpu") is a
    assert wt.Device.wgpu(features=None) is a
    x = wt.tensor(np.ones(4, np.float32), device=a)
    y = wt.tensor(np.ones(4, np.float32), device=wt.Device.parse("wgpu"))
    assert (x + y).numpy().tolist() == [2.0] * 4
    b = wt.Device.wgpu(features=())
    assert b is not a and b is wt.Device.wgpu(features=[])
    with pytest.raises(wt.DeviceMismatchError):
        x + wt.tensor(np.ones(4, np.float32), device=b)
    with pytest.raises(wt.UsageError, match="unknown WebGPU feature"):
        wt.Device.wgpu(features=("tensor-cores",))
    with pytest.raises(wt.UsageError, match="max_binding_bytes"):
        wt.Device.wgpu(max_binding_bytes=8)


def _expect(run, want, refusable: bool, scale=None, exact: bool = False) -> None:
    """`run()` equals `want()` (the CPU reference: bit for bit where `exact`, else within
    tolerance.assert_close of the magnitude `scale`); it may refuse with a BufferLimitError only when
    `refusable` (a row of an operand or of the result is over the binding limit by itself)."""
    try:
        got = run()
    except wt.BufferLimitError as e:
        assert refusable, e
        assert "binding limit" in str(e) or "over this device's limit" in str(e)
        return
    if exact:
        np.testing.assert_array_equal(got, want())
    else:
        assert_close(got, want(), scale)


@SETTINGS
@given(limit=st.integers(16, 1 << 16), m=st.integers(1, 40), k=st.integers(1, 48), n=st.integers(1, 70),
       seed=st.integers(0, 2**16))
@example(limit=16, m=5, k=1, n=1, seed=0)  # (found by the thorough profile: a.T's rows are m long)
def test_any_binding_limit(limit, m, k, n, seed):
    dev = wt.Device.wgpu(max_binding_bytes=limit)
    assert dev.max_binding_bytes() <= limit and dev.max_binding_bytes() % 4 == 0
    rng = np.random.default_rng(seed)
    a, w = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    bias, g = rng.standard_normal(n, np.float32), rng.standard_normal(k, np.float32)
    ids = rng.integers(0, m, 7).astype(np.int32)
    cpu = wt.Device.cpu()

    def both(f):
        return (lambda: f(dev).numpy()), (lambda: f(cpu).numpy())

    def t(x, d):
        return wt.tensor(x, device=d)

    limit = dev.max_binding_bytes()
    cases = [  # (op, the magnitude its outputs sum (tolerance.py), bit for bit, the longest row it has)
        (lambda d: wt.matmul(t(a, d), t(w, d)), linear_scale(a, w), False, max(k, n)),  # w may be row-chunked
        (lambda d: wt.linear(t(a, d), t(w.T.copy(), d).T, t(bias, d), act="gelu"), linear_scale(a, w, bias), False,
         max(k, n)),
        (lambda d: wt.embedding(t(a, d), t(ids, d)), None, True, k),
        (lambda d: wt.layer_norm(t(a, d), t(g, d), t(g, d)), layer_norm_scale(a, g, g, 1e-5), False, k),
        (lambda d: wt.softmax(t(a, d) * 2.0), None, False, k),
        (lambda d: t(a, d) + t(bias[:1], d), None, True, k),  # (one correctly rounded add)
        (lambda d: t(a, d).T.contiguous(), None, True, max(k, m))]  # (the result's rows are m long)
    for f, scale, exact, row in cases:
        run, want = both(f)
        _expect(run, want, 4 * row > limit, scale, exact)
    _expect(lambda: wt.argmax(t(a, dev)).numpy(), lambda: np.argmax(a, -1), 4 * k > limit, exact=True)
    _expect(lambda: t(a, dev).numpy(), lambda: a, 4 * k > limit, exact=True)  # uploads, readbacks


def test_shader_runtime_checks_switch(gpu, monkeypatch):
    """Native devices compile webtensor's kernels without the shader compiler's runtime checks by
    default; WEBTENSOR_SHADER_CHECKS=1 or shader_checks=True gives a device with them (another
    Device: the two keep their own pipelines), and describe() / stats() say which."""
    monkeypatch.delenv("WEBTENSOR_SHADER_CHECKS", raising=False)
    sw = gpu.ctx.info.is_software or None  # (the test device's adapter)
    plain = wt.Device.wgpu(software=sw)
    assert not plain.ctx.shader_checks and "shader runtime checks off" in plain.describe()
    assert plain.stats()["shader_checks"] == 0
    monkeypatch.setenv("WEBTENSOR_SHADER_CHECKS", "1")
    checked = wt.Device.wgpu(software=sw)
    assert checked is not plain and checked is wt.Device.wgpu(software=sw, shader_checks=True)
    assert checked.ctx.shader_checks and "shader runtime checks on" in checked.describe()
    assert checked.stats()["shader_checks"] == 1
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for dev in (plain, checked):  # the same kernels, both ways
        assert np.array_equal((wt.tensor(x, device=dev) * 2).numpy(), x * 2)
    monkeypatch.setenv("WEBTENSOR_SHADER_CHECKS", "yes")
    with pytest.raises(wt.UsageError, match="WEBTENSOR_SHADER_CHECKS='yes': expected 0 or 1"):
        wt.Device.wgpu()
