"""One conformance suite over the registry: for every registered family and every example config it carries
(`Family.examples`, at least one per architecture), a random checkpoint written by transformers itself, then

- float32 logits and greedy tokens equal to transformers' on the same weights, from the config.json transformers
  writes and from the example as published files lay it out (the top-level `rope_theta` / `rope_scaling` ...);
- the replayed step graph equal to the eager forward, bit for bit;
- a row alone equal to the same row among others in a batched step, bit for bit (batch invariance);
- the forward shapes its activations with the step's rows (`StepBatch.rows`): every product of an invariant step
  is a stack of one-row products — a family that forgets it fails here, not silently in a server;
- the server's engine: requests whose prompt chunks share steps with the others' decode rows get their greedy
  tokens (positions past the sliding windows);
- lavapipe equal to the CPU reference (float32 logits, greedy tokens);
- (one example a family) `webtensor generate` and `webtensor chat` from the command line;
- q8_0 at load equal to transformers running the dequantized q8_0 weights;
- a GGUF round trip through `formats.gguf_writer` (llama.cpp's layout): read back by webtensor with the
  checkpoint's logits (f32) and the q8_0-at-load model's (q8_0), and by transformers' GGUF reader where it knows
  the architecture (the example's config given, its tensors read from the file).

A new family gets all of it by being registered with its examples. One checkpoint per example, made once per
session (`_Example`); every model loaded at most once per device and dtype.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from tolerance import assert_close  # noqa: E402

import webtensor as wt  # noqa: E402
from webtensor import ops  # noqa: E402
from webtensor.formats.gguf_writer import write_gguf  # noqa: E402
from webtensor.models import loader, registry  # noqa: E402
from webtensor.runtime.runner import RunRow  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "webtensor" / "models" / "shipped"
EXAMPLES = [(f.name, name) for f in registry.families() for name in f.examples]
IDS = [int(i) for i in np.random.default_rng(7).integers(0, 4096, 21)]
N_CTX = 64
NEW = 8  # greedy tokens compared


def _ids(example: tuple[str, str]) -> str:
    return example[1]


class _Example:
    """One example config's random checkpoint (written by transformers), its published-layout twin, and the
    models loaded from them (each once)."""

    def __init__(self, family: str, name: str, root: Path):
        self.family = registry.by_name(family)
        self.raw = dict(self.family.examples[name])
        self.root = root / name
        self.models: dict[tuple[Any, ...], Any] = {}

    @cached_property
    def hf_dir(self) -> Path:
        """The checkpoint as transformers saves it (its own config.json layout), with the shipped tokenizer."""
        raw = dict(self.raw)
        torch.manual_seed(0)
        cfg = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        with torch.no_grad():  # norms and biases away from their init (1 or 0), so that they matter
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.copy_(0.1 * torch.randn_like(p))
                elif "norm" in name:
                    p.copy_(p + 0.2 * torch.randn_like(p))
        d = self.root / "hf"
        model.save_pretrained(d)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(SHIPPED / f, d / f)
        return d

    @cached_property
    def published_dir(self) -> Path:
        """The same weights with the example's config.json as published files lay it out."""
        d = self.root / "published"
        shutil.copytree(self.hf_dir, d)
        (d / "config.json").write_text(json.dumps(self.raw, indent=2))
        return d

    @cached_property
    def hf(self) -> Any:
        return transformers.AutoModelForCausalLM.from_pretrained(str(self.hf_dir), dtype=torch.float32).eval()

    def hf_logits(self, ids: list[int], model: Any = None) -> np.ndarray:
        with torch.no_grad():
            return (model or self.hf)(torch.tensor([ids])).logits[0].numpy()

    @cached_property
    def hf_greedy(self) -> list[int]:
        with torch.no_grad():
            out = self.hf.generate(torch.tensor([IDS[:6]]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                                   pad_token_id=0)
        return out[0, 6:].tolist()

    def load(self, source: Path | None = None, device: Any = "cpu", dtype: Any = "float32") -> Any:
        key = (source or self.hf_dir, str(device), dtype)
        if key not in self.models:
            self.models[key] = wt.load_model(key[0], device, dtype, n_ctx=N_CTX, kv_dtype="float32")
        return self.models[key]

    def gguf(self, outtype: str) -> Path:
        path = self.root / f"model.{outtype}.gguf"
        if not path.exists():
            write_gguf(self.hf_dir, path, outtype)
        return path


@pytest.fixture(scope="session")
def examples(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], _Example]:
    root = tmp_path_factory.mktemp("conformance")
    return {e: _Example(*e, root) for e in EXAMPLES}


def test_every_architecture_has_an_example():
    for f in registry.families():
        archs = {ex.get("model_type") for ex in f.examples.values()}
        assert archs >= set(f.hf_model_types), f"{f.name}: no example of {set(f.hf_model_types) - archs}"
        for name, raw in f.examples.items():
            assert f.config_from_hf(dict(raw), name).spec.family == f.name


@pytest.mark.parametrize("example", EXAMPLES, ids=_ids)
def test_float32_logits_and_greedy_match_transformers(examples, example):
    ex = examples[example]
    want = ex.hf_logits(IDS)
    m = ex.load()
    assert m.spec.family == ex.family.name and m.spec.architecture == ex.raw["model_type"]
    assert_close(m.logits(IDS), want, rtol=1e-5)
    assert m.generate(IDS[:6], NEW, stop_at_eos=False) == ex.hf_greedy  # the captured decode step
    published = ex.load(ex.published_dir)
    assert_close(published.logits(IDS), want, rtol=1e-5)


def _decode_logits(m: Any, use_graph: bool, invariant: bool = True, rows: int = 1) -> list[np.ndarray]:
    """Each step's logits of `rows` sequences (prompts of different lengths) decoded together for 4 steps from a
    fresh runner, the same tokens fed each time (IDS' next ones, not the argmax: the rows' inputs are fixed)."""
    runner = m.runner(rows, invariant=invariant, use_graph=use_graph)
    starts = [5 + 3 * r for r in range(rows)]
    for r, n in enumerate(starts):
        runner.prefill(r, IDS[:n])
    out = []
    for step in range(4):
        h = runner.launch([RunRow(r, (IDS[n + step],), n + step, read_logits=True) for r, n in enumerate(starts)])
        out.append(np.stack(runner.collect(h).logits))
    runner.close()
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=_ids)
def test_replayed_graph_equals_the_eager_forward(examples, example):
    m = examples[example].load()
    for eager, graph in zip(_decode_logits(m, False, rows=2), _decode_logits(m, True, rows=2), strict=True):
        assert np.array_equal(eager, graph)


def _row_alone_equals_row_in_batch(m: Any) -> None:
    batch = _decode_logits(m, True, rows=3)
    alone = _decode_logits(m, True, rows=1)
    for b, a in zip(batch, alone, strict=True):
        assert np.array_equal(b[0], a[0])


@pytest.mark.parametrize("example", EXAMPLES, ids=_ids)
def test_a_row_alone_equals_the_row_in_a_batch(examples, example):
    _row_alone_equals_row_in_batch(examples[example].load())


def _spy_linear_inputs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    real = ops.linear

    def spy(x: Any, *a: Any, **kw: Any) -> Any:
        shapes.append(tuple(x.shape))
        return real(x, *a, **kw)
    monkeypatch.setattr(ops, "linear", spy)
    return shapes


def _assert_one_row_products(m: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    shapes = _spy_linear_inputs(monkeypatch)
    _decode_logits(m, False, rows=3)
    decode = [s for s in shapes if s[0] == 3]
    assert decode, "no product over the step's rows"
    bad = [s for s in decode if len(s) != 3 or s[1] != 1]
    assert not bad, f"products over several rows at once in an invariant step (batch.rows not used): {bad[:3]}"


@pytest.mark.parametrize("example", EXAMPLES, ids=_ids)
def test_the_forward_shapes_activations_with_the_steps_rows(examples, example, monkeypatch):
    _assert_one_row_products(examples[example].load(), monkeypatch)


def test_the_row_check_fails_a_forward_that_ignores_the_steps_rows(examples, monkeypatch):
    """The check above can fail: a forward whose activations are (T, C) whatever the step (as if it shaped them
    itself instead of asking `batch.rows`) is caught."""
    from webtensor.runtime.batch import StepBatch

    m = examples[EXAMPLES[-1]].load()
    monkeypatch.setattr(StepBatch, "rows", lambda self, width: (self.T, width))
    with pytest.raises(AssertionError, match="batch.rows not used"):
        _assert_one_row_products(m, monkeypatch)


def _served_tokens(m: Any, prompts: list[list[int]], chunk: int) -> list[list[int]]:
    """Greedy tokens of `prompts` through the server's engine (`serve.engine.ModelEngine`, its replayed steps):
    all at once, one slot each, prompts read `chunk` tokens a row beside the others' decode rows."""
    from webtensor.serve.engine import ModelEngine, Row, Sampling

    engine = ModelEngine(m, len(prompts))
    fed, got = [0] * len(prompts), [[] for _ in prompts]
    while any(len(g) < NEW for g in got):
        rows = []
        for slot, (p, g) in enumerate(zip(prompts, got, strict=True)):
            if fed[slot] < len(p):
                ids = tuple(p[fed[slot]:fed[slot] + chunk])
                rows.append(Row(slot, ids, fed[slot], Sampling(), sample=fed[slot] + len(ids) == len(p),
                                new=fed[slot] == 0, prompt=tuple(p)))
                fed[slot] += len(ids)
            elif len(g) < NEW:
                rows.append(Row(slot, (g[-1],), len(p) + len(g) - 1, Sampling()))
        for row, tok in zip(rows, engine.step(rows), strict=True):
            if tok is not None:
                got[row.slot].append(tok)
    return got


@pytest.mark.parametrize("example", EXAMPLES, ids=_ids)
def test_the_servers_engine_gives_each_request_its_greedy_tokens(examples, example):
    """The serve path: three requests in one engine (prompt chunks beside decode rows in the same steps, positions
    past the family's sliding windows) get transformers' greedy tokens of their prompts."""
    ex = examples[example]
    prompts = [IDS[:6], IDS[3:16], IDS]
    got = _served_tokens(ex.load(), prompts, chunk=5)
    assert got[0] == ex.hf_greedy
    for p, g in zip(prompts[1:], got[1:], strict=True):
        assert g == ex.load().generate(p, NEW, stop_at_eos=False)


@pytest.mark.wgpu
@pytest.mark.parametrize("example", EXAMPLES, ids=_ids)
def test_lavapipe_equals_the_cpu_reference(examples, example, gpu):
    ex = examples[example]
    cpu, gp = ex.load(), ex.load(device=gpu)
    assert_close(gp.logits(IDS), cpu.logits(IDS), rtol=1e-4)
    assert gp.generate(IDS[:6], NEW, stop_at_eos=False) == ex.hf_greedy
    _row_alone_equals_row_in_batch(gp)


def _hf_with(ex: _Example, arrays: dict[str, np.ndarray]) -> Any:
    """transformers' model of the example with the weights `arrays` (canonical names, HF layout): the checkpoint
    rewritten key by key (so that transformers converts it as it converts any checkpoint: transformers 5 fuses a
    mixture of experts' matrices on load) and loaded."""
    from safetensors.numpy import load_file, save_file

    d = ex.root / f"hf_with_{len(list(ex.root.glob('hf_with_*')))}"
    d.mkdir()
    shutil.copy(ex.hf_dir / "config.json", d / "config.json")
    state = load_file(str(ex.hf_dir / "model.safetensors"))
    save_file({k: arrays.get(ex.family.canonical(k) or "", v) for k, v in state.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    return transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()


@pytest.mark.parametrize("example", EXAMPLES, ids=_ids)
def test_q8_0_at_load_equals_transformers_on_the_dequantized_weights(examples, example):
    ex = examples[example]
    m = ex.load(dtype="q8_0")
    arrays = loader.export_arrays(m)
    f32 = loader.export_arrays(ex.load())
    assert any(not np.array_equal(arrays[n], f32[n]) for n in arrays)  # (quantized: the weights moved)
    assert_close(m.logits(IDS), ex.hf_logits(IDS, _hf_with(ex, arrays)), rtol=1e-5)


def _transformers_reads_gguf(arch: str, model_type: str) -> bool:
    """Whether transformers' GGUF reader maps a file of `arch` onto a model of `model_type` (it names the file's
    tensors by the model's type: a Mistral written as llama.cpp's `llama` is not read into a Mistral)."""
    import gguf
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    model_type = {"gemma3_text": "gemma3"}.get(model_type, model_type)
    return arch == model_type and arch in GGUF_CONFIG_MAPPING and arch in gguf.MODEL_ARCH_NAMES.values()


@pytest.mark.parametrize("example", EXAMPLES, ids=_ids)
def test_gguf_round_trip(examples, example):
    ex = examples[example]
    f32, q8 = ex.gguf("f32"), ex.gguf("q8_0")
    m = ex.load(f32)
    assert replace(m.spec, architecture="") == replace(ex.load().spec, architecture="")  # (Mistral's is llama's)
    got = m.logits(IDS)
    assert_close(got, ex.hf_logits(IDS), rtol=1e-5)
    assert m.generate(IDS[:6], NEW, stop_at_eos=False) == ex.hf_greedy
    assert_close(ex.load(q8, dtype=None).logits(IDS), ex.load(dtype="q8_0").logits(IDS), rtol=1e-6)
    if _transformers_reads_gguf(m.family.gguf_architecture(m.config), ex.raw["model_type"]):
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(f32.parent), gguf_file=f32.name,
                                                               config=ex.hf.config, dtype=torch.float32).eval()
        assert_close(got, ex.hf_logits(IDS, hf), rtol=1e-5)


# a Gemma-style chat template (turns between <start_of_turn> and <end_of_turn>, the assistant named "model")
TEMPLATE = ("{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
            "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
            "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
ONE_A_FAMILY = [next(e for e in EXAMPLES if e[0] == f.name) for f in registry.families()]


def _cli(*args: str, stdin: bytes = b"") -> Any:
    import subprocess

    src = str(Path(__file__).resolve().parents[2] / "src")
    return subprocess.run([sys.executable, "-m", "webtensor", *args], input=stdin, capture_output=True, timeout=240,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": src, "XDG_RUNTIME_DIR": "/tmp"})


@pytest.mark.parametrize("example", ONE_A_FAMILY, ids=_ids)
def test_generate_and_chat_from_the_command_line(examples, example, tmp_path):
    """`webtensor generate` prints the model's greedy continuation; `webtensor chat` answers a message through the
    checkpoint's chat template, without an error line."""
    ex = examples[example]
    d = tmp_path / "model"
    shutil.copytree(ex.hf_dir, d)
    (d / "chat_template.jinja").write_text(TEMPLATE)
    m = ex.load()
    ids = m.encode("a b c")
    want = m.generate(ids, NEW, stop_at_eos=False)
    want = want[:next((i for i, t in enumerate(want) if t in m.spec.eos_ids), len(want))]  # (generate stops there)
    assert want  # (a continuation to find)
    r = _cli("generate", "-m", str(d), "-d", "cpu", "-t", "0", "-n", str(NEW), "a b c")
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert m.decode(want) in r.stdout.decode()
    r = _cli("chat", "-m", str(d), "-d", "cpu", "-t", "0", "-n", "4", stdin=b"Hello there\n")
    assert r.returncode == 0 and b"webtensor: error" not in r.stderr, r.stderr.decode()[-2000:]
