"""Device, tensor and scope behaviour: counters, batching, chunking, mismatches, async creation."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tolerance import assert_close, linear_scale

import webtensor as wt


def test_describe(cpu, gpu):
    assert cpu.describe() == "CPU (reference)"
    d = gpu.describe()
    assert d.startswith("WebGPU: ") and gpu.ctx.info.name in d and gpu.ctx.info.backend in d
    assert gpu.max_binding_bytes() >= 64 * 1024 and cpu.max_binding_bytes() > 2**40


def test_same_as_and_mismatch(cpu, gpu, gpu_small):
    assert gpu.same_as(wt.Device.wgpu()) and cpu.same_as(wt.Device.cpu())
    assert not gpu.same_as(cpu) and not gpu.same_as(gpu_small)
    a = wt.tensor(np.ones((2, 2), np.float32), device=cpu)
    b = wt.tensor(np.ones((2, 2), np.float32), device=gpu)
    with pytest.raises(wt.DeviceMismatchError, match="CPU \\(reference\\).*WebGPU"):
        a + b
    with pytest.raises(wt.DeviceMismatchError, match="two distinct WebGPU devices"):
        b @ wt.tensor(np.ones((2, 2), np.float32), device=gpu_small)


def test_to_moves_between_devices(cpu, gpu):
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    g = wt.tensor(x, device=cpu).to(gpu)
    assert g.device is gpu and np.array_equal(np.asarray(g), x)
    assert g.to(cpu).device is cpu and g.to(gpu) is g


def test_to_takes_device_names_and_dtypes_as_torch_does(cpu, gpu):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    g = wt.tensor(x, device=gpu)
    for name in ("cpu", "CPU", " cpu "):  # a device name, not a dtype
        c = g.to(name)
        assert c.device is cpu and c.dtype is wt.float32 and np.array_equal(c.numpy(), x)
    assert wt.tensor(x).to("wgpu").device is gpu and g.to("wgpu") is g and g.to(gpu) is g
    assert g.to("float32") is g and g.to(wt.float32) is g
    both = g.to("cpu", "float16")
    assert both.device is cpu and both.dtype is wt.float16
    np.testing.assert_array_equal(both.numpy(), x.astype(np.float16))
    kw = wt.tensor(x).to(device=gpu, dtype="float16") if gpu.has_f16 else wt.tensor(x).to(device=gpu)
    assert kw.device is gpu and np.allclose(kw.numpy(), x, atol=1e-3)
    with pytest.raises(wt.DTypeError, match="unsupported dtype 'cuda'"):
        g.to("cuda")
    with pytest.raises(TypeError, match="given twice"):
        g.to("cpu", device="cpu")
    with pytest.raises(TypeError, match="not a device"):
        g.to("float16", "float32")


def test_truth_value_and_comparisons_as_torch(device):
    one, zero = wt.tensor([[2.5]], device=device), wt.tensor(0, device=device)
    assert bool(one) is True and bool(zero) is False and (1 if one else 0) == 1
    assert float(one) == 2.5 and int(wt.tensor([7], device=device)) == 7
    for shape in ((3,), (0,), (2, 2)):
        with pytest.raises(wt.ShapeError, match=rf"truth value of a tensor of shape \({shape[0]},"):
            bool(wt.tensor(np.ones(shape, np.float32), device=device))
    a, b = wt.tensor([1.0, 2.0], device=device), wt.tensor([1.0, 3.0], device=device)
    for op in ("==", "!=", "<", "<=", ">", ">="):
        with pytest.raises(TypeError, match=f"Tensor {op} is not supported.*a.numpy\\(\\) {op} b.numpy\\(\\)"):
            eval(f"a {op} b")
    with pytest.raises(TypeError, match="Tensor == is not supported"):
        a == 1.0  # noqa: B015
    assert {a: "a", b: "b"}[b] == "b"  # hashable by identity, as torch's tensors


def test_graph_replay_counts_are_checked(device):
    x = wt.tensor([1.0, 2.0], device=device)
    g = device.capture(lambda: x * 2.0)
    assert g.replay(0) is g.replay(1)
    np.testing.assert_array_equal(g.replay(2).numpy(), [2.0, 4.0])
    for bad in (-1, 1.5, True, "2", None):
        with pytest.raises(wt.ArgumentError, match=r"replay\(times\): times must be an int >= 0"):
            g.replay(bad)


def test_scope_batches_into_one_submit(gpu):
    rng = np.random.default_rng(1)
    x = wt.tensor(rng.standard_normal((4, 64)).astype(np.float32), device=gpu)
    w = wt.tensor(rng.standard_normal((64, 64)).astype(np.float32), device=gpu)
    g, b = wt.tensor(np.ones(64, np.float32), device=gpu), wt.tensor(np.zeros(64, np.float32), device=gpu)
    s0 = gpu.stats()
    with gpu.dispatch_scope():
        y = wt.gelu(wt.layer_norm(x @ w + x, g, b))
        with gpu.dispatch_scope():  # nested: joins the outer scope
            y = wt.softmax(y)
        assert gpu.stats()["submits"] == s0["submits"]
    s1 = gpu.stats()
    assert s1["dispatches"] - s0["dispatches"] == 5
    assert s1["submits"] - s0["submits"] == 1
    c = wt.Device.cpu()
    xc, wc = wt.tensor(x.numpy(), device=c), wt.tensor(w.numpy(), device=c)
    want = wt.softmax(wt.gelu(wt.layer_norm(xc @ wc + xc, wt.tensor(g.numpy()), wt.tensor(b.numpy())))).numpy()
    assert_close(y, want)  # (fixed inputs, 64-wide rows of softmax: no cancellation)


def test_without_scope_each_dispatch_submits(gpu):
    x = wt.tensor(np.ones((8, 8), np.float32), device=gpu)
    s0 = gpu.stats()
    y = wt.gelu(x + x)
    s1 = gpu.stats()
    assert s1["dispatches"] - s0["dispatches"] == 2 and s1["submits"] - s0["submits"] == 2
    del y


def test_readback_inside_scope_flushes(gpu):
    x = wt.tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=gpu)
    with gpu.dispatch_scope():
        y = x * 2.0
        s0 = gpu.stats()
        assert s0["pending"] >= 1
        got = y.numpy()  # submits the pending work first
        s1 = gpu.stats()
        z = y + 1.0
    np.testing.assert_array_equal(got, np.arange(12, dtype=np.float32).reshape(3, 4) * 2)
    assert s1["readbacks"] - s0["readbacks"] == 1 and s1["submits"] - s0["submits"] == 1
    np.testing.assert_array_equal(z.numpy(), got + 1)


def test_bind_groups_and_buffers_are_reused_in_a_loop(gpu):
    rng = np.random.default_rng(2)
    x = wt.tensor(rng.standard_normal((2, 32)).astype(np.float32), device=gpu)
    w = wt.tensor(rng.standard_normal((32, 32)).astype(np.float32), device=gpu)

    def step():
        with gpu.dispatch_scope():
            return wt.gelu(x @ w).numpy()

    step()
    step()
    s0 = gpu.stats()
    for _ in range(5):
        step()
    s1 = gpu.stats()
    assert s1["bind_groups_created"] == s0["bind_groups_created"]
    assert s1["buffers_created"] == s0["buffers_created"]
    assert s1["bytes_in_use"] == s0["bytes_in_use"]


def test_row_chunking_under_small_cap(gpu_small, cpu):
    rng = np.random.default_rng(3)
    V, C = 301, 97  # 116,788 bytes in fp32: over the 64 KiB cap, so two chunks
    table = rng.standard_normal((V, C)).astype(np.float32)
    t = wt.tensor(table, device=gpu_small)
    assert len(t._storage.chunks) == 2
    np.testing.assert_array_equal(t.numpy(), table)
    ids = rng.integers(0, V, size=17).astype(np.int32)
    np.testing.assert_array_equal(wt.embedding(t, ids).numpy(), table[ids])
    x = rng.standard_normal((5, C)).astype(np.float32)
    logits = (wt.tensor(x, device=gpu_small) @ t.T).numpy()  # tied LM head: x @ wte.T
    assert_close(logits, x @ table.T, linear_scale(x, table.T))
    y = rng.standard_normal((3, V)).astype(np.float32)
    assert_close(wt.tensor(y, device=gpu_small) @ t, y @ table, linear_scale(y, table))  # chunks along K
    np.testing.assert_array_equal(t.T.numpy(), table.T)
    rows = t[3:5]  # a view inside one chunk: that chunk's buffer alone
    assert len(rows._storage.chunks) == 1 and np.array_equal(rows.numpy(), table[3:5])
    np.testing.assert_array_equal(t[100:250].numpy(), table[100:250])  # across the two chunks


def test_buffer_over_limit_is_refused(gpu_small):
    with pytest.raises(wt.BufferLimitError, match="binding limit"):
        wt.tensor(np.zeros((1, 70_000), np.float32), device=gpu_small)  # one row: nothing to split


def test_async_creation():
    async def main():
        dev = await wt.Device.wgpu_async()
        x = wt.tensor(np.full((2, 3), 2.0, np.float32), device=dev)
        return dev, (x * x).numpy()

    try:
        dev, out = asyncio.run(main())
    except wt.NoAdapterError as e:
        import conftest

        if conftest.IN_CI:
            raise
        pytest.skip(str(e))
    assert dev.kind == "wgpu" and dev.same_as(wt.Device.wgpu())
    np.testing.assert_array_equal(out, np.full((2, 3), 4.0))


def test_cpu_scope_is_noop(cpu):
    with cpu.dispatch_scope():
        y = wt.tensor(np.ones(3, np.float32)) + 1.0
    np.testing.assert_array_equal(y.numpy(), [2, 2, 2])
    assert cpu.stats()["submits"] == 0


def test_shape_and_dtype_errors(device):
    a = wt.tensor(np.ones((2, 3), np.float32), device=device)
    with pytest.raises(wt.ShapeError, match=r"\(2, 3\) @ \(2, 3\)"):
        a @ a
    with pytest.raises(ValueError):  # ShapeError is a ValueError
        a + wt.tensor(np.ones((4,), np.float32), device=device)
    with pytest.raises(wt.DTypeError, match="int32"):
        wt.gelu(wt.tensor(np.ones(3, np.int32), device=device))
    with pytest.raises(wt.DTypeError, match="unsupported dtype"):
        wt.tensor(np.ones(3, np.complex64), device=device)


def test_default_device_honours_env(monkeypatch):
    monkeypatch.setenv("WEBTENSOR_DEVICE", "cpu")
    assert wt.Device.default().kind == "cpu"
    monkeypatch.setenv("WEBTENSOR_DEVICE", "tpu")
    with pytest.raises(wt.WebtensorError, match="WEBTENSOR_DEVICE"):
        wt.Device.default()
