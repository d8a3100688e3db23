"""GPU faults surface as webtensor errors naming the op, never a hang or a crash, and the device
stays usable: invalid WGSL, workgroup counts over the limit (caught by webtensor, and by wgpu's own
validation at submit), failures inside a dispatch scope, a lost device, and interrupts
(KeyboardInterrupt) in the middle of a generation or of a readback."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest
from reliability_helpers import run_python, tiny_checkpoint, watchdog

import webtensor as wt
from webtensor.models.gpt2 import GPT2


def _softmax_ok(dev):
    """The device still computes a correct result, and nothing is left pending."""
    x = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)
    got = wt.softmax(wt.tensor(x, device=dev)).numpy()
    want = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, want / want.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert dev.stats()["pending"] == 0


def test_invalid_wgsl_kernel(gpu, tmp_path):
    from webtensor.backends.wgpu.signatures import Signature

    (tmp_path / "broken_kernel.wgsl").write_text(
        "struct P { n: u32 }\n@group(0) @binding(0) var<uniform> p: P;\n"
        "@group(0) @binding(1) var<storage, read_write> o: array<f32>;\n"
        "@compute @workgroup_size(64)\nfn main() { let v: f32 = undefined_thing * 2.0; }\n")
    sig = Signature("broken_kernel", "n", "-> o")
    path = str(tmp_path / "broken_kernel.wgsl")  # an absolute path: KERNEL_DIR is not used
    with watchdog(60):
        with pytest.raises(wt.GPUError, match=r"WebGPU error in .*broken_kernel(.|\n)*undefined_thing"):
            gpu.ctx.kernel(path, signature=sig)
        with pytest.raises(wt.GPUError, match=r"broken_kernel"):  # not cached as if it had compiled
            gpu.ctx.kernel(path, signature=sig)
        _softmax_ok(gpu)


def test_workgroups_over_the_limit_checked(gpu, monkeypatch):
    """webtensor checks workgroup counts against the device limit before recording (here a limit of
    2, so that a 5-row softmax needs 3 in one dimension)."""
    x = wt.tensor(np.ones((5, 4), np.float32), device=gpu)
    monkeypatch.setattr(gpu.ctx, "max_workgroups", 2)
    with watchdog(60):
        with pytest.raises(wt.GPUError, match=r"softmax.*: \(2, 3, 1\) workgroups is over the limit 2"):
            wt.softmax(x)
        assert gpu.stats()["pending"] == 0
        monkeypatch.undo()
        _softmax_ok(gpu)


def _rows_over_the_limit(gpu, monkeypatch):
    """A (limit + 1)-row input, and webtensor's own workgroup check lifted: the softmax of it then
    asks wgpu for limit + 1 workgroups in x, which wgpu's validation rejects at submit."""
    x = wt.tensor(np.ones((gpu.ctx.max_workgroups + 1, 1), np.float32), device=gpu)
    monkeypatch.setattr(gpu.ctx, "max_workgroups", 2**31)
    return x


def test_wgpu_validation_error_at_submit(gpu, monkeypatch):
    """wgpu's validation rejects the submit: a GPUError that names the op, raised at once; nothing is
    left pending and the next op runs normally."""
    x = _rows_over_the_limit(gpu, monkeypatch)
    with watchdog(60):
        with pytest.raises(wt.GPUError, match=r"WebGPU rejected a submit of 1 commands "
                           r"\(ops: softmax[^)]*\)(.|\n)*dispatch group size"):
            wt.softmax(x)
        assert gpu.stats()["pending"] == 0
        monkeypatch.undo()
        _softmax_ok(gpu)


def test_failure_inside_a_dispatch_scope(gpu, monkeypatch):
    """The failing command is submitted with the rest of the scope: the error comes at the scope's
    end and names every op in the batch; the device is usable after it."""
    x = wt.tensor(np.ones((2, 8), np.float32), device=gpu)
    big = _rows_over_the_limit(gpu, monkeypatch)
    with watchdog(60):
        with pytest.raises(wt.GPUError, match=r"rejected a submit of 3 commands \(ops: softmax.*, unary"):
            with gpu.dispatch_scope():
                wt.gelu(x)
                wt.gelu(x)
                wt.softmax(big)
        assert gpu.stats()["pending"] == 0

        # when the scope is already unwinding from another exception, that one wins
        with pytest.raises(ZeroDivisionError):
            with gpu.dispatch_scope():
                wt.softmax(big)
                raise ZeroDivisionError
        assert gpu.stats()["pending"] == 0
        monkeypatch.undo()
        _softmax_ok(gpu)


def test_launch_checks_its_declaration(gpu):
    """A launch names its parameters and buffers; the kernel's declaration refuses what does not
    fit: a missing buffer, an unknown name, a missing parameter, a written binding that aliases."""
    k = gpu.ctx.kernel("softmax", {"TX": "f32", "TO": "f32"})
    x = wt.tensor(np.ones(4, np.float32), device=gpu)
    buf = x._storage.buffer
    prm = dict(rows=1, cols=4, x_off=0, x_ld=4)
    with pytest.raises(wt.GPUError, match=r"softmax.*: binding 'o' needs a buffer"):
        gpu.ctx.launch(k, prm, dict(x=buf), (1, 1, 1))
    with pytest.raises(wt.GPUError, match=r"softmax.*: no binding\(s\) \['y'\]"):
        gpu.ctx.launch(k, prm, dict(x=buf, o=buf, y=buf), (1, 1, 1))
    o = wt.tensor(np.ones(4, np.float32), device=gpu)
    out = o._storage.buffer
    with pytest.raises(wt.GPUError, match=r"softmax: parameter 'cols' is required"):
        gpu.ctx.launch(k, dict(rows=1, x_off=0, x_ld=4), dict(x=buf, o=out), (1, 1, 1))
    with pytest.raises(wt.GPUError, match=r"binding 'o' is also bound to another binding"):
        gpu.ctx.launch(k, prm, dict(x=buf, o=buf), (1, 1, 1))
    _softmax_ok(gpu)


DEVICE_LOST = r"""
import json, time
import numpy as np, webtensor as wt
dev = wt.Device.wgpu(max_binding_bytes=2_718_280)
x = wt.tensor(np.ones((4, 8), np.float32), device=dev)
wt.softmax(x).numpy()
dev.ctx.api.device.destroy()  # what a driver reset / GPU hang recovery looks like from here
out = []
for what, fn in [("softmax", lambda: wt.softmax(x).numpy()), ("upload", lambda: wt.tensor([1.0], device=dev)),
                 ("add", lambda: (x + x).numpy()), ("read", lambda: x.numpy())]:
    t = time.perf_counter()
    try:
        fn()
        out.append([what, "no error", 0])
    except Exception as e:
        out.append([what, f"{type(e).__name__}: {e}", time.perf_counter() - t])
print(json.dumps(out))
"""


def test_device_lost():
    """A lost device: every op fails fast with GPUError (in a subprocess: a crash must not take pytest)."""
    r = run_python(DEVICE_LOST, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    for what, err, secs in json.loads(r.stdout.strip().splitlines()[-1]):
        assert err.startswith("GPUError: ") and "lost" in err, (what, err)
        assert secs < 5, (what, secs)


# -- interrupts ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wmodel(gpu):
    return GPT2.from_pretrained(tiny_checkpoint(), device=gpu)


PROMPT = [5, 17, 42, 99, 3]


def _reference(model, **kw):
    return model.generate(PROMPT, 12, **kw)


class _Interrupt:
    """Wraps a function to raise KeyboardInterrupt on its `n`-th call (a Ctrl-C landing there)."""

    def __init__(self, fn, n):
        self.fn, self.n, self.calls = fn, n, 0

    def __call__(self, *a, **k):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return self.fn(*a, **k)


@pytest.mark.parametrize("graphs", [True, False], ids=["capturing", "op-by-op"])
@pytest.mark.parametrize("nth", [2, 5, 9])
def test_interrupt_inside_the_forward(gpu, wmodel, monkeypatch, nth, graphs):
    """KeyboardInterrupt from inside an op in the middle of the prefill: while its chunk's graph is captured (a
    fresh runner captures it), or run op by op (no graphs, in its dispatch scope)."""
    want = _reference(wmodel)
    wmodel._runners.clear()  # (a fresh runner: the prompt's graph is captured again)
    monkeypatch.setattr(wmodel, "use_graph", graphs)
    hook = _Interrupt(wt.ops.linear, nth)
    monkeypatch.setattr(wt.ops, "linear", hook)
    with watchdog(60):
        with pytest.raises(KeyboardInterrupt):
            wmodel.generate(PROMPT, 12)
        monkeypatch.undo()
        wmodel._runners.clear()
        assert hook.calls == nth
        assert gpu.stats()["pending"] == 0  # the scope flushed (or dropped) what was recorded
        assert gpu.ctx._capture is None  # (an interrupted capture is over)
        assert _reference(wmodel) == want
        _softmax_ok(gpu)


def test_interrupt_between_tokens(gpu, wmodel):
    """The consumer interrupts a long generation (a callback raising KeyboardInterrupt), or just
    stops iterating and closes it: the device is clean and the next generation is unchanged."""
    want = _reference(wmodel)
    sampled = _reference(wmodel, temperature=0.9, top_k=20, seed=7)
    with watchdog(60):
        for kw in ({}, dict(temperature=0.9, top_k=20, seed=7)):
            got = []
            with pytest.raises(KeyboardInterrupt):
                for i, tok in enumerate(wmodel.generate_ids(PROMPT, 12, **kw)):
                    got.append(tok)
                    if i == 4:
                        raise KeyboardInterrupt
            assert got == (want if not kw else sampled)[:5]
            gc.collect()
            gpu.synchronize()
            assert gpu.stats()["pending"] == 0

            gen = wmodel.generate_ids(PROMPT, 12, **kw)
            assert [next(gen) for _ in range(3)] == (want if not kw else sampled)[:3]
            gen.close()
            gpu.synchronize()
            assert gpu.stats()["pending"] == 0
        assert _reference(wmodel) == want
        assert _reference(wmodel, temperature=0.9, top_k=20, seed=7) == sampled
        _softmax_ok(gpu)


INTERRUPTED_READBACK = r"""
import json, sys
import numpy as np, wgpu, webtensor as wt
from webtensor.models.gpt2 import GPT2
dev = wt.Device.wgpu()
model = GPT2.from_pretrained(CHECKPOINT, device=dev)
prompt = [5, 17, 42, 99, 3]
want = {"greedy": model.generate(prompt, 10), "sampled": model.generate(prompt, 10, temperature=0.8, seed=3)}
cls = type(dev.ctx.api.device.create_buffer(size=256, usage=wgpu.BufferUsage.COPY_DST))
real_map_async = cls.map_async
out = {}
for name, kw in [("greedy", {}), ("sampled", dict(temperature=0.8, seed=3))]:
    for nth in (1, 3):
        calls = [0]
        def interrupted_map_async(self, *a, **k):
            calls[0] += 1
            promise = real_map_async(self, *a, **k)
            if calls[0] == nth:  # Ctrl-C while waiting for the GPU: the map is requested, never awaited
                raise KeyboardInterrupt
            return promise
        cls.map_async = interrupted_map_async
        try:
            model.generate(prompt, 10, **kw)
            res = "not interrupted"
        except KeyboardInterrupt:
            res = "interrupted"
        cls.map_async = real_map_async
        again = [model.generate(prompt, 10, **kw) for _ in range(2)]
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        ok = bool(np.allclose(wt.softmax(wt.tensor(x, device=dev)).numpy().sum(-1), 1.0))
        out[f"{name}-{nth}"] = [res, again[0] == want[name] and again[1] == want[name], ok,
                                dev.stats()["pending"]]
print(json.dumps(out))
"""


def test_interrupt_during_readback():
    """Ctrl-C while `.numpy()` / sampling waits for the GPU leaves a staging buffer mapping; the next
    readback must not reuse it (wgpu-native aborts the process on a submit that writes a buffer that
    is still mapped). In a subprocess, so an abort fails this test rather than killing pytest."""
    r = run_python(INTERRUPTED_READBACK.replace("CHECKPOINT", repr(str(tiny_checkpoint()))), timeout=180)
    assert r.returncode == 0, f"the interpreter died (rc {r.returncode}): {r.stderr[-2500:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for case, (res, same, ok, pending) in out.items():
        assert res == "interrupted", case
        assert same and ok and pending == 0, (case, same, ok, pending)


# -- tensors that die in a reference cycle ----------------------------------------------------------


class _Cycle:
    pass


def test_pool_survives_tensors_dying_in_a_cycle():
    """A tensor freed by the cycle collector (e.g. one held by a saved traceback) may have its wgpu
    buffer finalised before its storage hands it back to the pool: that buffer must not be reused."""
    dev = wt.Device.wgpu(max_binding_bytes=1_234_564)  # its own device: a regression poisons the pool
    try:
        holder = _Cycle()
        holder.me = holder
        holder.t = wt.tensor(np.ones(1000, np.float32), device=dev)
        del holder
        gc.collect()
        y = wt.tensor(np.full(1000, 2.0, np.float32), device=dev)  # same size: the pooled buffer
        np.testing.assert_array_equal(y.numpy(), 2.0)
    finally:
        dev.release()
