"""Finding checkpoints: the shipped default, a directory, and ids in the local Hugging Face cache
(offline); plus `webtensor devices`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from gpt2_fixtures import make_checkpoint  # noqa: E402

import webtensor as wt  # noqa: E402
from webtensor.formats.safetensors_reader import SHIPPED, resolve  # noqa: E402
from webtensor.models.gpt2 import GPT2  # noqa: E402


def _fake_hf_cache(root: Path, repo: str, ckpt: Path) -> Path:
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<rev>/...}."""
    base = root / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / "0123abcd"
    shutil.copytree(ckpt, snap)
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text("0123abcd")
    return snap


def test_model_ids_resolve_in_local_hf_cache(tmp_path, monkeypatch, cpu):
    ckpt = make_checkpoint(tmp_path / "ckpt", vocab_size=300, n_embd=32, n_layer=1, n_head=2)
    cache = tmp_path / "hub"
    snap = _fake_hf_cache(cache, "openai-community/gpt2-medium", ckpt)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert resolve("gpt2-medium") == snap  # short id -> openai-community/...
    assert resolve("openai-community/gpt2-medium") == snap
    m = GPT2.from_pretrained("gpt2-medium", device=cpu)
    assert m.config.n_embd == 32 and len(m.generate([1, 2, 3], 4)) == 4
    with pytest.raises(wt.CheckpointError, match=r"not in the local Hugging Face cache .*models--gpt2-xl"):
        resolve("gpt2-xl")


def test_default_model_is_the_shipped_one():
    assert resolve(None) == SHIPPED and (SHIPPED / "model.safetensors").is_file()


def test_devices_command_lists_adapters(gpu):
    r = subprocess.run([sys.executable, "-m", "webtensor.cli", "devices"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert gpu.ctx.info.name in out and "backend=" in out and "type=" in out
    assert "max-storage-buffer-binding-size" in out and "features:" in out and "default device:" in out


def test_cpu_auto_loads_float16_weights_as_float32_with_the_same_logits(tmp_path):
    """The CPU reference widens every float16 product to float32 (`Backend.widens_f16`), so "auto" keeps a
    float16 checkpoint's matrices in float32 there: the logits are those of dtype="float16", bit for bit."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    d = make_checkpoint(tmp_path / "f16", vocab_size=300, n_embd=32, n_layer=2, n_head=2)
    weights = load_file(str(d / "model.safetensors"))
    save_file({k: v.astype(np.float16) for k, v in weights.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    auto = wt.load_model(d, device="cpu")
    kept = wt.load_model(d, device="cpu", dtype="float16")
    assert auto.weights.blocks[0].attn_w.dtype is wt.float32 and kept.weights.blocks[0].attn_w.dtype is wt.float16
    ids = [5, 17, 42, 7, 99]
    assert np.array_equal(auto.logits(ids), kept.logits(ids))
