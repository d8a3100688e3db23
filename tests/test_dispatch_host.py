"""The host side of an eager dispatch (what tools/prefill_host.py times): the fast paths it takes give what the
general paths give. Parameters packed by one struct call equal the field by field packing (bytes and errors), a
kernel is found by its defines in any order, rows a:b of a tensor are the view _slice_view computes, and a
prompt pass run twice reuses every buffer and bind group and gives the same logits bit for bit."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import webtensor as wt
from webtensor.backends.wgpu.signatures import SIGNATURES, Signature
from webtensor.tensor import _slice_view

_U32 = st.integers(0, 2**32 - 1)
_I32 = st.integers(-(2**31), 2**31 - 1)
_F32 = st.floats(-1e30, 1e30, allow_nan=False) | st.integers(-(2**20), 2**20)


def _value(draw: st.DrawFn, typ: str) -> object:
    if typ == "u32":
        return draw(_U32 | st.integers(0, 2**20).map(float) | st.booleans() | _U32.map(np.uint32))
    if typ == "i32":
        return draw(_I32 | _I32.map(np.int64))
    if typ == "f32":
        return draw(_F32)
    inner = _U32 if typ == "vec4u" else _F32
    return draw(st.lists(inner, min_size=4, max_size=4) | st.tuples(inner, inner, inner, inner))


@st.composite
def _params(draw: st.DrawFn) -> tuple[Signature, dict[str, object]]:
    sig = SIGNATURES[draw(st.sampled_from(sorted(SIGNATURES)))]
    values = {}
    for f in sig.fields:
        if f.default is None or draw(st.booleans()):
            values[f.name] = _value(draw, f.type)
    return sig, values


def _field_by_field(sig: Signature, values: dict[str, object]) -> bytes:
    buf = bytearray(sig.size)
    sig.pack(values, into=buf)  # (`into` takes the field by field path)
    return bytes(buf)


@settings(max_examples=300, deadline=None)
@given(case=_params())
def test_pack_equals_field_by_field(case):
    """Every kernel's declaration, values of every kind a planner passes (ints, integral floats and bools for u32,
    numpy ints, ints for f32, lists and tuples for vec4), defaults left out or given: the same bytes."""
    sig, values = case
    packed = sig.pack(values)
    assert len(packed) == sig.size
    assert packed == _field_by_field(sig, values)


def test_pack_refuses_what_it_always_refused():
    sig = Signature("k", "a b:f32 v:vec4u c=7", "x -> o")
    ok = dict(a=1, b=2.5, v=[1, 2, 3, 4])
    assert struct.unpack("<If8x4I4x4x", sig.pack(ok)[:40])[:6] == (1, 2.5, 1, 2, 3, 4)
    assert struct.unpack("<I", sig.pack(ok)[32:36]) == (7,)  # the default, packed as u32
    assert sig.pack(dict(ok, a=3.0))[:4] == struct.pack("<I", 3)  # an integral float for a u32: converted
    for bad, match in ((dict(ok, a=-1), "does not fit u32"), (dict(ok, a=2**32), "does not fit u32"),
                       (dict(ok, v=[1, 2, 3]), "does not fit vec4u"), (dict(ok, b=1e40), None),
                       (dict(ok, zz=1), "no parameter"), ({"b": 1.0, "v": [0] * 4}, "'a' is required")):
        with pytest.raises((wt.GPUError, OverflowError), match=match):
            sig.pack(bad)
        with pytest.raises((wt.GPUError, OverflowError), match=match):
            _field_by_field(sig, bad)


def test_kernel_found_by_its_defines_in_any_order(gpu):
    ctx = gpu.ctx
    a = ctx.kernel("softmax", {"TX": "f32", "TO": "f32"})
    made = ctx.counters["pipelines_created"]
    assert ctx.kernel("softmax", {"TO": "f32", "TX": "f32"}) is a
    assert ctx.kernel("softmax", {"TX": "f32", "TO": "f32"}) is a
    assert ctx.counters["pipelines_created"] == made


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(0, 6), min_size=1, max_size=4), perm_seed=st.integers(0, 100),
       offset=st.integers(0, 50), start=st.none() | st.integers(-8, 8), stop=st.none() | st.integers(-8, 8))
def test_rows_view_is_slice_view(cpu, shape, perm_seed, offset, start, stop):
    """x[a:b] (the rows of a row-wise op's block) on any strided view: _slice_view's shape, strides and offset,
    and numpy's values."""
    base = np.arange(max(1, int(np.prod(shape))) + offset, dtype=np.float32)
    t = wt.tensor(base, device=cpu)[offset:offset + int(np.prod(shape))].reshape(shape)
    perm = list(np.random.default_rng(perm_seed).permutation(len(shape)))
    t = t.permute(*perm)
    got = t[start:stop]
    assert (got.shape, got.strides, got._offset) == _slice_view(t.shape, t.strides, t._offset, (slice(start, stop),))
    want = t.numpy()[start:stop]
    assert got.shape == want.shape and np.array_equal(got.numpy(), want)


def test_prompt_pass_twice_reuses_everything(gpu):
    """The eager prompt pass of a small Llama-family model, again and again: from the third on (the second takes
    the pooled buffers in the opposite order, so it binds them anew) a pass makes no buffer, bind group or pipeline
    (the pool and the caches serve it all), and every pass gives the first's logits bit for bit."""
    from webtensor.models import loader, registry

    found = registry.preset("smollm2-135m")
    assert found is not None
    family, _, raw = found
    raw = dict(raw, num_hidden_layers=2, hidden_size=144, intermediate_size=96, vocab_size=512,
               max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
    model = loader.random(family.name, family.config_from_hf(raw, "test"), device=gpu, n_ctx=64)
    runner = model.runner(1)
    ids = [(7 * i + 3) % 512 for i in range(11)]
    first = runner.prefill(0, ids).numpy()
    np.testing.assert_array_equal(runner.prefill(0, ids).numpy(), first)
    ctx = gpu.ctx
    for _ in range(2):
        before = dict(ctx.counters)
        again = runner.prefill(0, ids).numpy()
        made = {k: ctx.counters[k] - before[k] for k in ("buffers_created", "bind_groups_created", "pipelines_created")}
        assert made == dict(buffers_created=0, bind_groups_created=0, pipelines_created=0)
        assert ctx.counters["dispatches"] > before["dispatches"]
        np.testing.assert_array_equal(again, first)
