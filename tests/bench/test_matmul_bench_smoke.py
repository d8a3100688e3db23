"""`webtensor.bench.matmul_bench` runs on any adapter, forces the kernel each variant names, and
writes its JSON. A functional smoke test: no speed is asserted."""

from __future__ import annotations

import json

import pytest

from webtensor.bench import matmul_bench


def test_variants_run_the_kernels_they_name(gpu):
    variants = ["engine", "engine-128x128", "tiled64", "gemv"]
    report = matmul_bench.measure([9], [(64, 72)], ["float32"], variants, reps=1, device=gpu)
    kernels = {r["variant"]: r["kernel"] for r in report["rows"]}
    assert kernels == {"engine": "matmul_engine", "engine-128x128": "matmul_engine", "tiled64": "matmul",
                       "gemv": "gemv"}
    assert all(r["us"] > 0 and r["gflops"] > 0 and (r["M"], r["K"], r["N"]) == (9, 64, 72) for r in report["rows"])


def test_float16_variants_run_the_engine(gpu):
    if not gpu.ctx.has_f16:
        pytest.skip("this adapter has no shader-f16")
    variants = ["engine", *(f"engine-{f}" for f in matmul_bench.F16)]
    report = matmul_bench.measure([9], [(64, 72)], ["float32", "float16"], variants, reps=1, device=gpu)
    got = sorted((r["dtype"], r["variant"]) for r in report["rows"])
    assert got == sorted([("float32", "engine")] + [("float16", v) for v in variants])  # F16 ones: float16 only
    assert {r["kernel"] for r in report["rows"]} == {"matmul_engine"}


def test_main_writes_json(tmp_path, gpu):
    out = tmp_path / "mm.json"
    assert matmul_bench.main(["--m", "9", "--shapes", "64x72", "--dtypes", "float32", "--variants", "default",
                              "--reps", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["adapter"] and len(report["rows"]) == 1 and report["rows"][0]["variant"] == "default"
