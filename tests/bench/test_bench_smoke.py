"""`webtensor bench` runs end to end on tiny checkpoints of each family (GPT-2, and a Qwen2-style Llama-family model
with GQA, q/k/v biases and a tied head) and writes JSON with every field (and a PNG); `--llama-bench` runs a
llama-bench binary and reads its report. A functional smoke test: no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from gpt2_fixtures import make_checkpoint  # noqa: E402
from llama_fixtures import make_llama  # noqa: E402

FIELDS = {"engine", "device", "model", "dtype", "prefill_tok_s", "prefill_ms", "ttft_ms", "decode_tok_s",
          "decode_ms_per_token", "decode_tokens", "per_step", "memory_mb", "extra"}


def checkpoint(family: str, d: Path, variant: str = "qwen2") -> Path:
    """A tiny random checkpoint whose greedy continuations vary (matrices of std ~0.3: no near-ties)."""
    if family == "gpt2":
        return make_checkpoint(d, vocab_size=300, n_embd=64, n_layer=2, n_head=4)
    from safetensors.numpy import load_file, save_file

    make_llama(d, variant)
    weights = load_file(str(d / "model.safetensors"))
    save_file({k: v * np.float32(15.0) if v.ndim == 2 else v for k, v in weights.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    return d


@pytest.mark.hf  # --compare runs transformers and a torch step beside webtensor
@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("device", ["cpu", "wgpu"])
def test_bench_writes_every_field(tmp_path, device, family, gpu):
    pytest.importorskip("torch")
    ckpt = checkpoint(family, tmp_path / "ckpt")
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
            "ratios_webtensor_over_torch_step", "load"} <= set(report)
    assert report["architecture"] == ("gpt2" if family == "gpt2" else "qwen2")
    ours, hf, step = report["results"]
    assert FIELDS <= set(ours) and FIELDS <= set(hf) and FIELDS <= set(step)
    assert ours["engine"] == "webtensor" and hf["engine"] == "hf-transformers"
    assert step["engine"] in ("torch-step (cpu)", "torch+cudagraph")  # the second anchor
    assert step["extra"]["cuda_graph"] == (step["engine"] == "torch+cudagraph")
    assert step["extra"]["tokens_agreeing_with_hf"] == 7  # the same model as HF: all 1 + 6 greedy tokens
    assert ours["extra"]["tokens_agreeing_with_hf"] == 7  # and webtensor's
    assert len(set(ours["extra"]["greedy_tokens"][0])) > 2
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
    ckpt = checkpoint("llama", tmp_path / "ckpt", "llama-gqa")
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
    assert results[2]["extra"]["tokens_agreeing_with_hf"] == 7  # every row of the torch step's batch is HF's


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
    code = ("import sys, webtensor.cli, webtensor.bench.cli, webtensor.bench.model_bench, webtensor.bench.llama_bench; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, sorted(sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


# A stand-in for llama.cpp's llama-bench: it checks the arguments the bench passes, keeps a copy of the GGUF file it
# was given, and prints a report in llama-bench's `-o json` form with figures made from its arguments.
FAKE_LLAMA_BENCH = """#!{python}
import json, shutil, sys
args = sys.argv[1:]
opt = {{args[i]: args[i + 1] for i in range(0, len(args) - 1, 2)}}
assert opt["-o"] == "json" and opt["-r"] == "1", args
with open(opt["-m"], "rb") as f:
    assert f.read(4) == b"GGUF", "not a GGUF file"
shutil.copy(opt["-m"], {seen!r})
tests = []
for t in map(int, opt.get("-t", "4").split(",")):  # (llama-bench runs every test at each thread count)
    common = dict(build_commit="fake", model_filename=opt["-m"], model_type="test", model_size=1000, n_threads=t,
                  backends="CPU", cpu_info="a CPU", gpu_info="", n_batch=2048, n_ubatch=512)
    tests += [dict(common, n_prompt=int(p), n_gen=0, avg_ts=1000.0 * t + int(p), stddev_ts=1.5)
              for p in opt["-p"].split(",")]
    tests.append(dict(common, n_prompt=0, n_gen=int(opt["-n"]), avg_ts=25.0 * t, stddev_ts=0.5))
print(json.dumps(tests))
"""


def fake_llama_bench(tmp_path: Path) -> tuple[Path, Path]:
    exe, seen = tmp_path / "llama-bench", tmp_path / "seen.gguf"
    exe.write_text(FAKE_LLAMA_BENCH.format(python=sys.executable, seen=str(seen)))
    exe.chmod(0o755)
    return exe, seen


@pytest.mark.parametrize("processes", [1, 2])
def test_llama_bench_beside_webtensor(tmp_path, processes):
    """`--llama-bench PATH` on a checkpoint directory: a GGUF of the same weights is written for it (float32 here:
    the logits of the file llama-bench got are the checkpoint's), its report becomes the "llama.cpp" result (once,
    also over several processes) with its ratios."""
    import webtensor as wt

    ckpt = make_llama(tmp_path / "ckpt", "llama-gqa")
    exe, seen = fake_llama_bench(tmp_path)
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "webtensor.cli", "bench", "--model", str(ckpt), "--device", "cpu",
                        "--dtype", "float32", "--prompts", "8,16", "--decode", "4", "--repeats", "1", "--processes",
                        str(processes), "--llama-bench", str(exe), "--llama-bench-args", "-t 2", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(out.read_text())
    ours, lcpp = report["results"]
    assert lcpp["engine"] == "llama.cpp" and "2 threads" in lcpp["device"]
    assert lcpp["prefill_tok_s"] == {"8": 2008.0, "16": 2016.0} and lcpp["decode_tok_s"] == 50.0
    assert lcpp["ttft_ms"] == pytest.approx(8 / 2008 * 1e3) and lcpp["extra"]["prefill_16_stddev_tok_s"] == 1.5
    assert "-t 2" in lcpp["extra"]["command"] and "(f32)" in lcpp["extra"]["gguf"]
    ratios = report["ratios_webtensor_over_llama_cpp"]
    assert ratios["decode_tok_s"] == pytest.approx(ours["decode_tok_s"] / 50.0)
    assert ratios["prefill_16_tok_s"] == pytest.approx(ours["prefill_tok_s"]["16"] / 2016.0)
    assert "ratio webtensor / llama.cpp" in r.stdout
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    want = wt.load_model(ckpt, device="cpu", dtype="float32").logits(ids)
    got = wt.load_model(seen, device="cpu").logits(ids)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_llama_bench_runs_the_gguf_given(tmp_path):
    """A .gguf model run as stored: llama-bench gets that very file; several thread counts (`-t 1,2`) become a
    result each, with their ratios."""
    from webtensor.formats.gguf_writer import write_gguf

    ckpt = make_llama(tmp_path / "ckpt", "llama-gqa")
    gguf = write_gguf(ckpt, tmp_path / "model.q8_0.gguf", "q8_0")
    exe, seen = fake_llama_bench(tmp_path)
    r = subprocess.run([sys.executable, "-m", "webtensor.cli", "bench", "--model", str(gguf), "--device", "cpu",
                        "--prompts", "8", "--decode", "4", "--repeats", "1", "--processes", "1", "--llama-bench",
                        str(exe), "--llama-bench-args", "-t 1,2", "--json", str(tmp_path / "b.json")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert seen.read_bytes() == gguf.read_bytes() and "the file given" in r.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    ours, t1, t2 = report["results"]
    assert (t1["engine"], t1["decode_tok_s"], t2["engine"], t2["decode_tok_s"]) == ("llama.cpp -t 1", 25.0,
                                                                                    "llama.cpp -t 2", 50.0)
    assert report["ratios_webtensor_over_llama_cpp_t2"]["decode_tok_s"] == pytest.approx(ours["decode_tok_s"] / 50)
    assert report["ratios_webtensor_over_llama_cpp"] == report["ratios_webtensor_over_llama_cpp_t1"]
    assert "ratio webtensor / llama.cpp -t 2  decode_tok_s" in r.stdout


def test_llama_bench_refusals(tmp_path):
    exe, _ = fake_llama_bench(tmp_path)
    for extra, msg in ((["--model", "smollm2-135m", "--llama-bench", str(exe)], "is a preset"),
                       (["--model", "smollm2-135m", "--llama-bench", str(tmp_path / "none")], "not an executable"),
                       (["--model", "no-such-model-or-preset"], "nor is 'no-such-model-or-preset' a preset")):
        r = subprocess.run([sys.executable, "-m", "webtensor.cli", "bench", "--device", "cpu", *extra],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and msg in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
