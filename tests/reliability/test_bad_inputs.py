"""Every bad input gets a specific webtensor error whose message names the problem.

Ops (wrong shapes / dtypes, on the CPU and on WebGPU), devices (mismatch, released, buffer limits,
no adapter), checkpoints (missing, broken config.json, broken safetensors, pickle), tokenizer files,
generation parameters, and the `webtensor generate` CLI."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
from reliability_helpers import copy_checkpoint, run_python, tiny_checkpoint

import webtensor as wt
from webtensor.errors import ArgumentError
from webtensor.models.gpt2 import GPT2

# -- ops --------------------------------------------------------------------------------------------


def f32(d, *shape):
    return wt.tensor(np.ones(shape, np.float32), device=d)


def i32(d, *shape):
    return wt.tensor(np.ones(shape, np.int32), device=d)


OP_CASES = [
    # (id, call(device), error, message pattern)
    ("matmul-inner", lambda d: f32(d, 2, 3) @ f32(d, 4, 5), wt.ShapeError,
     r"matmul: inner dims differ: \(2, 3\) @ \(4, 5\) \(3 != 4\)"),
    ("matmul-batch", lambda d: wt.matmul(f32(d, 2, 3, 4), f32(d, 3, 4, 5)), wt.ShapeError,
     r"matmul: batch dims differ: \(2, 3, 4\) @ \(3, 4, 5\)"),
    ("matmul-1d-b", lambda d: wt.matmul(f32(d, 3, 4), f32(d, 4)), wt.ShapeError,
     r"matmul: needs a of at least 1 dim and b of at least 2, got \(3, 4\) @ \(4,\)"),
    ("matmul-int", lambda d: wt.matmul(i32(d, 2, 2), f32(d, 2, 2)), wt.DTypeError,
     r"matmul needs float32 or float16 tensors, got int32"),
    ("matmul-not-tensor", lambda d: wt.matmul(f32(d, 2, 2), [[1.0]]), wt.DTypeError,
     r"matmul: both operands must be Tensors, got Tensor @ list"),
    ("add-broadcast", lambda d: f32(d, 2, 3) + f32(d, 4), wt.ShapeError,
     r"add: shapes \(2, 3\) and \(4,\) cannot be broadcast together"),
    ("mul-broadcast", lambda d: wt.mul(f32(d, 5, 2), f32(d, 3, 1, 3)), wt.ShapeError,
     r"mul: shapes \(5, 2\) and \(3, 1, 3\) cannot be broadcast together"),
    ("add-int", lambda d: f32(d, 2) + i32(d, 2), wt.DTypeError,
     r"add needs float32 or float16 tensors, got int32"),
    ("mul-operand", lambda d: f32(d, 2) * "2", wt.DTypeError, r"mul: unsupported operand str"),
    ("linear-weight", lambda d: wt.linear(f32(d, 2, 4), f32(d, 5, 3)), wt.ShapeError,
     r"linear: x \(2, 4\) @ weight \(5, 3\): needs weight \(K, N\) with K = x.shape\[-1\]"),
    ("linear-bias", lambda d: wt.linear(f32(d, 2, 4), f32(d, 4, 3), f32(d, 4)), wt.ShapeError,
     r"linear: bias must have shape \(3,\), got \(4,\)"),
    ("linear-residual", lambda d: wt.linear(f32(d, 2, 4), f32(d, 4, 3), residual=f32(d, 3, 2)), wt.ShapeError,
     r"linear: residual must have the output's shape \(2, 3\), got \(3, 2\)"),
    ("linear-activation", lambda d: wt.linear(f32(d, 2, 4), f32(d, 4, 3), act="prelu"), ArgumentError,
     r"linear: act must be None or one of gelu_tanh, .*, got 'prelu'"),
    ("linear-int", lambda d: wt.linear(f32(d, 2, 4), i32(d, 4, 3)), wt.DTypeError, r"linear needs float32"),
    ("layer_norm-weight", lambda d: wt.layer_norm(f32(d, 2, 4), f32(d, 3), f32(d, 4)), wt.ShapeError,
     r"layer_norm: x \(2, 4\) needs weight and bias of shape \(4,\), got \(3,\) and \(4,\)"),
    ("layer_norm-int", lambda d: wt.layer_norm(i32(d, 2, 4), f32(d, 4), f32(d, 4)), wt.DTypeError,
     r"layer_norm needs float32 or float16 tensors, got int32"),
    ("layer_norm-eps", lambda d: wt.layer_norm(f32(d, 2, 4), f32(d, 4), f32(d, 4), eps=-1e-5), ArgumentError,
     r"layer_norm: eps must be a number >= 0, got -1e-05"),
    ("softmax-int", lambda d: wt.softmax(i32(d, 3)), wt.DTypeError, r"softmax needs float32 or float16"),
    ("softmax-0d", lambda d: wt.softmax(f32(d)), wt.ShapeError,
     r"softmax needs at least 1 dim, got shape \(\)"),
    ("attention-ndim", lambda d: wt.attention(f32(d, 4, 8), f32(d, 4, 8), f32(d, 4, 8)), wt.ShapeError,
     r"attention: q, k, v must be \(T, H, D\) / \(S, KVH, D\); got \(4, 8\)"),
    ("attention-heads", lambda d: wt.attention(f32(d, 2, 2, 4), f32(d, 3, 4, 4), f32(d, 3, 4, 4)),
     wt.ShapeError,
     r"attention: 2 query heads do not split evenly over 4 key/value heads \(needs H % KVH == 0\)"),
    ("attention-causal", lambda d: wt.attention(f32(d, 5, 2, 4), f32(d, 3, 2, 4), f32(d, 3, 2, 4)),
     wt.ShapeError,
     r"causal attention needs at least as many keys as queries \(S=3 < T=5\)"),
    ("attention-int", lambda d: wt.attention(f32(d, 1, 1, 4), i32(d, 1, 1, 4), f32(d, 1, 1, 4)),
     wt.DTypeError,
     r"attention needs float32 or float16 tensors, got int32"),
    ("embedding-id-high", lambda d: wt.embedding(f32(d, 5, 3), [0, 7, 1]), wt.ShapeError,
     r"embedding: id 7 is out of range for a table of 5 rows"),
    ("embedding-id-negative", lambda d: wt.embedding(f32(d, 5, 3), np.array([[2, -1]])), wt.ShapeError,
     r"embedding: id -1 is out of range for a table of 5 rows"),
    ("embedding-id-float", lambda d: wt.embedding(f32(d, 5, 3), f32(d, 2)), wt.DTypeError,
     r"embedding: ids must be int32, got float32"),
    ("embedding-host-float", lambda d: wt.embedding(f32(d, 5, 3), [0.5, 1.0]), wt.DTypeError,
     r"embedding: ids must be integers, got float64"),
    ("embedding-table", lambda d: wt.embedding(f32(d, 5), [0]), wt.ShapeError,
     r"embedding: table must be 2-d \(V, C\), got \(5,\)"),
    ("argmax-int", lambda d: wt.argmax(i32(d, 4)), wt.DTypeError, r"argmax needs float32 or float16"),
    ("argmax-empty", lambda d: wt.argmax(f32(d, 3, 0)), wt.ShapeError,
     r"argmax needs a non-empty last axis, got shape \(3, 0\)"),
    ("gelu-int", lambda d: wt.gelu(i32(d, 4)), wt.DTypeError, r"gelu needs float32 or float16"),
    ("copy_into-shape", lambda d: wt.copy_into(f32(d, 4, 3)[1:3], f32(d, 3, 3)), wt.ShapeError,
     r"copy_into: destination shape \(2, 3\) != source shape \(3, 3\)"),
    ("copy_into-dtype", lambda d: wt.copy_into(f32(d, 2, 3), i32(d, 2, 3)), wt.DTypeError,
     r"copy_into: cannot copy int32 into float32"),
    ("reshape-size", lambda d: f32(d, 2, 3).reshape(4, 2), wt.ShapeError,
     r"cannot reshape \(2, 3\) \(6 elements\) into \(4, 2\)"),
    ("reshape-two-minus-one", lambda d: f32(d, 2, 3).reshape(-1, -1), wt.ShapeError,
     r"reshape \(2, 3\) -> \(-1, -1\): only one dim may be -1"),
    ("index-out-of-range", lambda d: f32(d, 2, 3)[2], wt.ShapeError,
     r"index 2 .*(out of range|out of bounds)"),
    ("tensor-dtype", lambda d: wt.tensor(np.zeros(3, np.complex64), device=d), wt.DTypeError,
     r"unsupported dtype .*complex64.*webtensor tensors hold float32, float16, int32"),
    ("tensor-int-overflow", lambda d: wt.tensor(np.array([2**40]), device=d), wt.DTypeError,
     r"integer values do not fit int32"),
    ("tensor-ragged", lambda d: wt.tensor([[1.0, 2.0], [3.0]], device=d), wt.ShapeError,
     r"cannot make a rectangular array"),
]


@pytest.mark.parametrize("call, error, pattern", [c[1:] for c in OP_CASES], ids=[c[0] for c in OP_CASES])
def test_op_bad_input(device, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(device)


def test_cast_int_on_wgpu_refused(gpu):
    with pytest.raises(wt.DTypeError, match=r"cast between float32 and int32 is not supported \(float types only\)"):
        f32(gpu, 3).to(wt.int32)


# -- devices ----------------------------------------------------------------------------------------


def test_device_mismatch_cpu_and_wgpu(cpu, gpu):
    with pytest.raises(wt.DeviceMismatchError, match=r"add: tensors are on different devices: "
                       r"CPU \(reference\) and WebGPU: .*; move one with \.to\(device\)"):
        f32(cpu, 2) + f32(gpu, 2)
    with pytest.raises(wt.DeviceMismatchError, match=r"layer_norm: tensors are on different devices"):
        wt.layer_norm(f32(gpu, 2, 4), f32(cpu, 4), f32(gpu, 4))


def test_device_mismatch_two_wgpu_devices(gpu, gpu_small):
    with pytest.raises(wt.DeviceMismatchError, match=r"matmul: .*\(two distinct WebGPU devices\)"):
        f32(gpu, 2, 2) @ f32(gpu_small, 2, 2)
    with pytest.raises(wt.DeviceMismatchError, match=r"embedding: .*two distinct WebGPU devices"):
        wt.embedding(f32(gpu, 4, 2), wt.tensor([1], device=gpu_small))


def test_unknown_device_names():
    with pytest.raises(wt.WebtensorError, match=r"unknown device 'tpu': expected cpu, wgpu, wgpu:N \(adapter N of "
                       r"`webtensor devices`\), lavapipe or auto"):
        wt.Device.parse("tpu")
    r = run_python("import webtensor as wt; wt.Device.default()", env={"WEBTENSOR_DEVICE": "quantum"})
    assert r.returncode != 0
    assert "UsageError: WEBTENSOR_DEVICE='quantum': expected 'cpu' or 'wgpu'" in r.stderr


def test_tensor_used_after_device_released(gpu):
    # a dedicated device (unusual binding cap: not shared with any fixture), released under the tensors
    dev = wt.Device.wgpu(max_binding_bytes=3_141_592)
    assert dev is not gpu and dev.ctx is not gpu.ctx
    x = wt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=dev)
    y = wt.softmax(x)
    dev.release()
    pat = r"the WebGPU device '.*' was released; create a new Device"
    with pytest.raises(wt.DeviceReleasedError, match=pat):
        x.numpy()
    with pytest.raises(wt.DeviceReleasedError, match=pat):
        x + x
    with pytest.raises(wt.DeviceReleasedError, match=pat):
        wt.softmax(y)
    with pytest.raises(wt.DeviceReleasedError, match=pat):
        wt.tensor([1.0, 2.0], device=dev)
    with pytest.raises(wt.DeviceReleasedError, match=pat):
        dev.synchronize()
    del x, y  # dropping tensors of a released device is harmless
    dev.release()  # idempotent
    fresh = wt.Device.wgpu(max_binding_bytes=3_141_592)  # the cache hands out a new device
    assert fresh is not dev
    z = wt.tensor(np.zeros((1, 4), np.float32), device=fresh)
    np.testing.assert_allclose(wt.softmax(z).numpy(), 0.25)
    fresh.release()


def test_buffer_over_binding_limit_unsplittable(gpu_small):
    limit = gpu_small.max_binding_bytes()
    assert limit == 64 * 1024
    with pytest.raises(wt.BufferLimitError, match=r"a tensor of shape \(2, 20000\) \(160,000 bytes\) is over "
                       r"the binding limit of 65,536 bytes and cannot be split into row chunks: one row of its "
                       r"first axis is 80,000 bytes"):
        wt.tensor(np.zeros((2, 20000), np.float32), device=gpu_small)
    flat = wt.tensor(np.arange(20000, dtype=np.float32), device=gpu_small)  # 1-d: its elements are its rows
    assert len(flat._storage.chunks) == 2 and np.array_equal(flat.numpy(), np.arange(20000))


def test_buffer_over_max_buffer_size(gpu):
    ctx = gpu.ctx
    n = ctx.max_buffer_bytes + 1
    before = gpu.stats()["bytes_in_use"]
    with pytest.raises(wt.BufferLimitError, match=rf"a buffer of {n:,} bytes is over this device's limit "
                       rf"\(max binding {ctx.max_binding_bytes:,} B, "
                       rf"max buffer {ctx.max_buffer_bytes:,} B\)"):
        ctx.alloc(n)
    assert gpu.stats()["bytes_in_use"] == before  # nothing was allocated


NO_ADAPTER_ENV = {
    # hide every Vulkan driver (lavapipe included) and the EGL vendors (wgpu's GL backend finds
    # llvmpipe through EGL otherwise)
    "VK_ICD_FILENAMES": "/nonexistent.json",
    "VK_DRIVER_FILES": "/nonexistent.json",
    "__EGL_VENDOR_LIBRARY_FILENAMES": "/nonexistent.json",
    "WEBTENSOR_DEVICE": "",
}

NO_ADAPTER_SCRIPT = r"""
import json, warnings
import webtensor as wt
from webtensor.backends.wgpu.gpu_api import NativeGpu
out = {"adapters": [str(a.info.get("device")) for a in NativeGpu.enumerate()]}
try:
    wt.Device.wgpu()
    out["wgpu"] = "no error"
except wt.NoAdapterError as e:
    out["wgpu"] = "NoAdapterError: " + str(e)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    devs = [wt.Device.default(), wt.Device.default()]
out["default"] = [d.kind for d in devs]
out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
print(json.dumps(out))
"""


def test_no_adapter():
    r = run_python(NO_ADAPTER_SCRIPT, env=NO_ADAPTER_ENV)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["adapters"] == [], f"the drivers were not hidden: {out['adapters']}"
    assert re.fullmatch(r"NoAdapterError: no WebGPU adapter: .*Install a Vulkan driver "
                        r".*mesa-vulkan-drivers.*or use Device\.cpu\(\)", out["wgpu"]), out["wgpu"]
    assert out["default"] == ["cpu", "cpu"]
    assert len(out["warnings"]) == 1, out["warnings"]
    assert re.fullmatch(r"RuntimeWarning: webtensor: no WebGPU adapter was found\. "
                        r"Install a Vulkan driver .*; using the CPU", out["warnings"][0])


# -- checkpoints and tokenizer files ---------------------------------------------------------------


def _config(d):
    return json.loads((d / "config.json").read_text())


def _set_config(d, **kv):
    cfg = _config(d)
    for k, v in kv.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


def _rewrite_tensors(d, fn):
    from safetensors.numpy import load_file, save_file

    path = d / "model.safetensors"
    tensors = load_file(str(path))
    fn(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _truncate(d, frac):
    p = d / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[: int(len(data) * frac)])


def _patch_bytes(d, offset, new):
    p = d / "model.safetensors"
    data = bytearray(p.read_bytes())
    data[offset:offset + len(new)] = new
    p.write_bytes(bytes(data))


def _pickle_only(d):
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")


def _transpose(name):
    def fn(ts):
        ts[name] = np.ascontiguousarray(ts[name].T)
    return fn


def _to_int(name):
    def fn(ts):
        ts[name] = ts[name].astype(np.int32)
    return fn


CHECKPOINT_CASES = [
    # (id, break(dir), error, message pattern)
    ("config-missing", lambda d: (d / "config.json").unlink(), wt.CheckpointError,
     r"config\.json is missing: a checkpoint directory needs config\.json"),
    ("config-not-json", lambda d: (d / "config.json").write_text('{"n_embd": 32,'), wt.CheckpointError,
     r"config\.json is not valid JSON"),
    ("config-not-object", lambda d: (d / "config.json").write_text("[1, 2]"), wt.CheckpointError,
     r"config\.json must hold a JSON object, got list"),
    ("config-lacks-keys", lambda d: _set_config(d, n_layer=None, n_head=None), wt.CheckpointError,
     r"config\.json lacks required keys: n_layer, n_head"),
    ("config-wrong-type", lambda d: _set_config(d, n_embd="wide"), wt.CheckpointError,
     r"config\.json: a hyper-parameter has the wrong type"),
    ("config-infinite", lambda d: (d / "config.json").write_text(
        (d / "config.json").read_text().replace('"n_embd": 32', '"n_embd": 1e999')), wt.CheckpointError,
     r"config\.json: a hyper-parameter has the wrong type"),
    ("config-inconsistent", lambda d: _set_config(d, n_head=5), wt.CheckpointError,
     r"inconsistent sizes \(n_embd=32 must be a positive multiple of n_head=5"),
    ("config-negative-eps", lambda d: _set_config(d, layer_norm_epsilon=-1.0), wt.CheckpointError,
     r"layer_norm_epsilon must be a finite number >= 0, got -1\.0"),
    ("config-eos-type", lambda d: _set_config(d, eos_token_id="end"), wt.CheckpointError,
     r"eos_token_id must be an integer token id or null, got 'end'"),
    ("config-model-type", lambda d: _set_config(d, model_type="bert"), wt.CheckpointError,
     r"model_type 'bert' is not supported"),
    ("config-activation", lambda d: _set_config(d, activation_function="prelu"), wt.CheckpointError,
     r"activation_function 'prelu' is not supported \(it has a learned slope\)"),
    ("config-huge-n_layer", lambda d: _set_config(d, n_layer=10**12), wt.CheckpointError,
     r"the config says 1000000000000 layers, but the checkpoint holds only 28 tensors"),
    ("safetensors-truncated", lambda d: _truncate(d, 0.7), wt.CheckpointError,
     r"model\.safetensors is not a valid safetensors file: tensor '.*': data_offsets .* reach past the end "
     r"of the data section \(\d+ bytes\): the file is truncated"),
    ("safetensors-empty", lambda d: _truncate(d, 0), wt.CheckpointError,
     r"model\.safetensors is not a valid safetensors file"),
    ("safetensors-corrupt-header", lambda d: _patch_bytes(d, 9, b"\x00garbage\xff{{"), wt.CheckpointError,
     r"model\.safetensors is not a valid safetensors file"),
    ("safetensors-header-length", lambda d: _patch_bytes(d, 0, (2**40).to_bytes(8, "little")),
     wt.CheckpointError,
     r"model\.safetensors is not a valid safetensors file"),
    ("tensor-wrong-shape", lambda d: _rewrite_tensors(d, _transpose("transformer.h.1.mlp.c_fc.weight")),
     wt.CheckpointError, r"tensor 'h\.1\.mlp\.c_fc\.weight' has shape \(128, 32\), expected \(32, 128\) "
     r"from config\.json"),
    ("tensor-missing", lambda d: _rewrite_tensors(d, lambda ts: ts.pop("transformer.ln_f.bias")),
     wt.CheckpointError, r"tensor 'ln_f\.bias' is missing from the checkpoint"),
    ("tensor-int-dtype", lambda d: _rewrite_tensors(d, _to_int("transformer.wpe.weight")),
     wt.CheckpointError, r"tensor 'wpe\.weight' is stored as I32; webtensor reads F32, F16, BF16, F64 there"),
    ("pickle-only", _pickle_only, wt.CheckpointError,
     r"holds only pickle checkpoints \(pytorch_model\.bin\); webtensor refuses them because "
     r"unpickling can run arbitrary code"),
    ("no-weights", lambda d: (d / "model.safetensors").unlink(), wt.CheckpointError,
     r"has no model\.safetensors"),
    ("tokenizer-missing", lambda d: (d / "tokenizer.json").unlink(), wt.TokenizerError,
     r"has no tokenizer: it needs tokenizer\.json, or vocab\.json and merges\.txt"),
    ("tokenizer-merges-missing",
     lambda d: ((d / "tokenizer.json").unlink(), (d / "vocab.json").write_text("{}")),
     wt.TokenizerError, r"needs tokenizer\.json, or vocab\.json and merges\.txt"),
    ("tokenizer-corrupt", lambda d: (d / "tokenizer.json").write_text('{"model": '), wt.TokenizerError,
     r"tokenizer\.json: invalid JSON"),
]


@pytest.mark.parametrize("breaker, error, pattern", [c[1:] for c in CHECKPOINT_CASES],
                         ids=[c[0] for c in CHECKPOINT_CASES])
def test_broken_checkpoint(tmp_path, breaker, error, pattern):
    d = copy_checkpoint(tmp_path / "ckpt")
    breaker(d)
    with pytest.raises(error, match=pattern):
        GPT2.from_pretrained(d, device="cpu")


def test_missing_checkpoint_directory(tmp_path):
    with pytest.raises(wt.CheckpointError, match=r"checkpoint directory .*/nope does not exist"):
        GPT2.from_pretrained(tmp_path / "nope", device="cpu")


def test_model_id_not_in_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(wt.CheckpointError, match=r"model 'gpt2-nonexistent' is not in the local Hugging Face "
                       r"cache .*webtensor never downloads at run time"):
        GPT2.from_pretrained("gpt2-nonexistent", device="cpu")


# -- generation -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    return GPT2.from_pretrained(tiny_checkpoint(), device="cpu")


GEN_CASES = [
    # (id, kwargs for generate, error, message pattern); the prompt is [1, 2, 3] unless given
    ("prompt-over-context", dict(ids=list(range(64)), max_new_tokens=1), wt.ContextLengthError,
     r"prompt of 64 tokens \+ 1 new tokens = 65 exceeds the model's context of 64 positions"),
    ("prompt-plus-new-over-context", dict(max_new_tokens=62), wt.ContextLengthError,
     r"prompt of 3 tokens \+ 62 new tokens = 65 exceeds the model's context of 64"),
    ("truncate-but-too-many-new", dict(max_new_tokens=64, truncate_prompt=True), wt.ContextLengthError,
     r"^64 new tokens leave no room for the prompt in the model's context of 64 positions \(truncate_prompt keeps "
     r"the prompt's last tokens, but at least one must fit\); lower max_new_tokens to 63 or less$"),
    ("empty-prompt", dict(ids=[]), wt.SamplingError, r"the prompt is empty: give at least one token"),
    ("text-prompt", dict(ids="hello"), wt.SamplingError, r"expected token ids; use model\.stream\(text\)"),
    ("token-out-of-range", dict(ids=[1, 320]), wt.SamplingError,
     r"token id 320 is out of range for a vocabulary of 320"),
    ("negative-temperature", dict(temperature=-0.5), wt.SamplingError,
     r"temperature must be a finite number >= 0 \(0 = greedy\), got -0\.5"),
    ("nan-temperature", dict(temperature=float("nan")), wt.SamplingError,
     r"temperature must be a finite number"),
    ("top_p-zero", dict(temperature=1.0, top_p=0.0), wt.SamplingError,
     r"top_p must be in \(0, 1\] \(or None = off\), got 0\.0"),
    ("top_p-over-one", dict(temperature=1.0, top_p=1.5), wt.SamplingError,
     r"top_p must be in \(0, 1\].*got 1\.5"),
    ("top_k-negative", dict(temperature=1.0, top_k=-3), wt.SamplingError,
     r"top_k must be an integer >= 0 \(0 or None = off\), got -3"),
    ("top_k-float", dict(temperature=1.0, top_k=2.5), wt.SamplingError,
     r"top_k must be an integer >= 0.*got 2\.5"),
    ("max_new_tokens-float", dict(max_new_tokens=2.5), wt.SamplingError,
     r"max_new_tokens must be an integer >= 1, got 2\.5"),
    ("max_new_tokens-str", dict(max_new_tokens="8"), wt.SamplingError,
     r"max_new_tokens must be an integer >= 1, got '8'"),
    ("max_new_tokens-negative", dict(max_new_tokens=-1), wt.SamplingError,
     r"max_new_tokens must be an integer >= 1, got -1"),
    ("max_new_tokens-zero", dict(max_new_tokens=0), wt.SamplingError,
     r"max_new_tokens must be an integer >= 1, got 0"),
]


@pytest.mark.parametrize("kw, error, pattern", [c[1:] for c in GEN_CASES], ids=[c[0] for c in GEN_CASES])
def test_bad_generation_request(model, kw, error, pattern):
    kw = dict(kw)
    ids = kw.pop("ids", [1, 2, 3])
    with pytest.raises(error, match=pattern):
        model.generate(ids, **kw)


def test_empty_text_prompt(model):
    with pytest.raises(wt.SamplingError, match=r"the prompt is empty"):
        list(model.stream("", 4))


def test_prompt_over_context_on_wgpu(gpu):
    m = GPT2.from_pretrained(tiny_checkpoint(), device=gpu)
    with pytest.raises(wt.ContextLengthError, match=r"65 tokens exceed the context of 64"):
        m.logits(list(range(65)))
    assert gpu.stats()["pending"] == 0


# -- the CLI ----------------------------------------------------------------------------------------


def _cli(*args):
    return run_python("import sys; from webtensor.cli import main; sys.exit(main(sys.argv[1:]))".replace(
        "sys.argv[1:]", repr(list(args))))


@pytest.mark.parametrize("args, code, pattern", [
    (["--model", "/nonexistent/model-dir"], 1, r"webtensor: error: checkpoint directory /nonexistent/model-dir "
     r"does not exist"),
    (["--temperature", "-1", "--model", "TINY"], 2,
     r"webtensor: error: argument --temperature/-t: temperature must be a finite number >= 0"),
], ids=["bad-model", "bad-temperature"])
def test_cli_error_exit_code(args, code, pattern):
    args = [str(tiny_checkpoint()) if a == "TINY" else a for a in args]
    r = _cli("generate", "hello", "--device", "cpu", *args)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("webtensor: error:")]
    assert len(errors) == 1 and re.match(pattern, errors[0]), r.stderr
    others = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("[webtensor]")]
    assert others == errors, f"stderr has more than the one-line error: {r.stderr!r}"
    if args[0] == "--model":
        assert r.stderr.strip() == errors[0]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
