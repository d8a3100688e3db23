"""`webtensor bench` runs end to end on a tiny checkpoint and writes JSON with every field (and a
PNG). A functional smoke test: no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from gpt2_fixtures import make_checkpoint  # noqa: E402

FIELDS = {"engine", "device", "model", "dtype", "prefill_tok_s", "prefill_ms", "ttft_ms", "decode_tok_s",
          "decode_ms_per_token", "decode_tokens", "per_step", "memory_mb", "extra"}


@pytest.mark.hf  # --compare runs transformers and a torch step beside webtensor
@pytest.mark.parametrize("device", ["cpu", "wgpu"])
def test_bench_writes_every_field(tmp_path, device, gpu):
    pytest.importorskip("torch")
    ckpt = make_checkpoint(tmp_path / "ckpt", vocab_size=300, n_embd=64, n_layer=2, n_head=4)
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    cmd = [sys.executable, "-m", "webtensor.cli", "bench", "--model", str(ckpt), "--device", device,
           "--prompts", "8,16", "--decode", "6", "--repeats", "1", "--processes", "1", "--json", str(out),
           "--compare"]
    if device == "wgpu":
        cmd += ["--profile"]
    pytest.importorskip("matplotlib")
    cmd += ["--plot", str(png)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(out.read_text())
    assert {"date", "machine", "command", "model", "dtype", "results", "ratios_webtensor_over_hf",
            "ratios_webtensor_over_torch_step"} <= set(report)
    ours, hf, step = report["results"]
    assert FIELDS <= set(ours) and FIELDS <= set(hf) and FIELDS <= set(step)
    assert ours["engine"] == "webtensor" and hf["engine"] == "hf-transformers"
    assert step["engine"] in ("torch-step (cpu)", "torch+cudagraph")  # the second anchor
    assert step["extra"]["cuda_graph"] == (step["engine"] == "torch+cudagraph")
    assert step["extra"]["tokens_agreeing_with_hf"] == 7  # the same model as HF: all 1 + 6 greedy tokens
    for res in (ours, hf, step):
        assert set(res["prefill_tok_s"]) == {"8", "16"} and res["decode_tokens"] == 6 and res["decode_tok_s"] > 0
    for key, other in (("ratios_webtensor_over_hf", hf), ("ratios_webtensor_over_torch_step", step)):
        ratios = report[key]
        assert ratios["decode_tok_s"] == pytest.approx(ours["decode_tok_s"] / other["decode_tok_s"])
        assert ratios["prefill_16_tok_s"] == pytest.approx(ours["prefill_tok_s"]["16"] / other["prefill_tok_s"]["16"])
    if device == "wgpu":
        assert ours["per_step"]["dispatches"] > 0 and ours["per_step"]["submits"] <= 1
        assert ours["memory_mb"] > 0
        prof = ours["extra"]["profile"]
        assert prof["dispatches"] > 0 and len(prof["per_dispatch"]) == prof["dispatches"]
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "decode tok/s" in r.stdout and "ratio webtensor / torch step" in r.stdout


@pytest.mark.hf  # --compare
def test_bench_batch(tmp_path, gpu):
    """`--batch B`: B sequences decode together on every engine; decode tok/s is the aggregate."""
    pytest.importorskip("torch")
    ckpt = make_checkpoint(tmp_path / "ckpt", vocab_size=300, n_embd=64, n_layer=2, n_head=4)
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "webtensor.cli", "bench", "--model", str(ckpt), "--device", "wgpu",
                        "--prompts", "8", "--decode", "6", "--repeats", "1", "--batch", "3", "--compare",
                        "--processes", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    assert len(results) == 3
    for res in results:
        assert res["extra"]["batch"] == 3
        assert res["decode_tok_s"] == pytest.approx(3 * res["extra"]["decode_tok_s_per_sequence"])


def test_bench_in_fresh_processes(tmp_path):
    """The default: the measurement in fresh processes; `results` hold the medians, `spread` min /
    median / max of each figure over the processes, `processes` each process's own report."""
    ckpt = make_checkpoint(tmp_path / "ckpt", vocab_size=300, n_embd=64, n_layer=2, n_head=4)
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "webtensor.cli", "bench", "--model", str(ckpt), "--device", "cpu",
                        "--prompts", "8,16", "--decode", "4", "--repeats", "1", "--processes", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(out.read_text())
    assert len(report["processes"]) == 2 and "== process 2 of 2" in r.stdout and "min / median / max" in r.stdout
    ours = report["results"][0]
    runs = [p["results"][0] for p in report["processes"]]
    for key, got in (("decode_tok_s", ours["decode_tok_s"]), ("prefill_tok_s/16", ours["prefill_tok_s"]["16"])):
        vals = sorted(x[key] if "/" not in key else x["prefill_tok_s"]["16"] for x in runs)
        assert report["spread"]["webtensor"][key] == pytest.approx([vals[0], sum(vals) / 2, vals[1]])
        assert got == pytest.approx(sum(vals) / 2)  # the median of two


def test_bench_imports_torch_only_for_compare():
    """webtensor (and its bench) run without torch: the anchors import it when --compare runs them."""
    code = ("import sys, webtensor.cli, webtensor.bench.cli, webtensor.bench.gpt2_bench; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, sorted(sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
