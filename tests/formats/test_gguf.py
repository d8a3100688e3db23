"""GGUF checkpoints of GPT-2 (written by the gguf package's own GGUFWriter from a random HF model):
tensors equal to the source, config and tokenizer from the metadata, logits against HF, q8_0
GGUF == safetensors quantized at load, clear errors for bad files, and the pure-Python reader
equal to the gguf package's."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from gguf_fixtures import hf_tensors, write_gguf, write_gguf_metadata  # noqa: E402
from gpt2_fixtures import CORPUS, make_checkpoint  # noqa: E402
from tolerance import assert_close  # noqa: E402

import webtensor as wt  # noqa: E402
from webtensor import quant  # noqa: E402
from webtensor.errors import CheckpointError, TokenizerError  # noqa: E402
from webtensor.formats.gguf_pure import GGUFFile  # noqa: E402
from webtensor.models.gpt2 import GPT2  # noqa: E402
from webtensor.models.loader import open_checkpoint  # noqa: E402


def held_in_q8(name: str) -> bool:
    return name == "wte.weight" or (name.startswith("h.") and name.endswith(
        ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")))

gguf = pytest.importorskip("gguf")
Q8 = gguf.GGMLQuantizationType.Q8_0
OUTTYPES = ("f32", "f16", "q8_0")
READERS = ("gguf", "pure")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    d = make_checkpoint(root / "hf", vocab_size=320, n_embd=64, n_layer=2, n_head=2)
    out = {"hf": d}
    for t in OUTTYPES:
        out[t] = write_gguf(d, root / f"model-{t}.gguf", t)
    return out


@pytest.fixture(scope="module")
def source(files: dict[str, Path]) -> dict[str, np.ndarray]:
    return hf_tensors(files["hf"])


def _gguf_q8_roundtrip(arr: np.ndarray, transposed: bool) -> np.ndarray:
    """What the gguf package's q8_0 makes of an HF tensor, back in HF layout."""
    stored = np.ascontiguousarray(arr.T) if transposed else arr
    back = gguf.quants.dequantize(gguf.quants.quantize(stored, Q8), Q8)
    return back.T if transposed else back


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("outtype", OUTTYPES)
def test_tensors_equal_source(files, source, outtype, reader) -> None:
    ck = open_checkpoint(files[outtype], reader=reader)
    assert ck.names - {"lm_head.weight"} == set(source)  # (+ the tied head's stored copy, output.weight)
    for name, src in source.items():
        got = ck.array(name)
        assert got.shape == src.shape, name
        matrix = src.ndim == 2 and name != "wpe.weight"
        if outtype == "f32" or not matrix:
            assert ck.stored_type(name) == "F32" and np.array_equal(got, src), name
        elif outtype == "f16":
            assert got.dtype == np.float16 and np.array_equal(got, src.astype(np.float16)), name
        else:
            assert ck.stored_type(name) == "Q8_0"
            assert np.array_equal(got, _gguf_q8_roundtrip(src, name.startswith("h."))), name


def test_config_and_tokenizer_from_metadata(files) -> None:
    ck = open_checkpoint(files["f16"])
    hf = GPT2.from_pretrained(files["hf"], device="cpu")
    assert ck.config == hf.config.__class__(**{**vars(hf.config), "layer_norm_epsilon": ck.config.layer_norm_epsilon})
    assert ck.config.layer_norm_epsilon == pytest.approx(hf.config.layer_norm_epsilon, rel=1e-6)  # stored as f32
    for text in [*CORPUS, "<|endoftext|>one<|endoftext|>", "unseen: ∑ ℵ 🦀"]:
        ids = hf.tokenizer.encode(text)
        assert ck.tokenizer.encode(text) == ids
        assert ck.tokenizer.decode(ids) == hf.tokenizer.decode(ids)
    assert ck.tokenizer.eos_token_id == ck.config.eos_token_id


def test_pure_python_tokenizer_from_metadata(files, monkeypatch) -> None:
    ref = open_checkpoint(files["f32"]).tokenizer
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # the browser: no compiled tokenizers
    pure = open_checkpoint(files["f32"], reader="pure").tokenizer
    assert pure.kind == "pure-python"
    for text in CORPUS:
        assert pure.encode(text) == ref.encode(text)


@pytest.mark.hf
def test_f32_gguf_logits_match_hf(files) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(files["hf"])).eval()
    m = GPT2.from_pretrained(files["f32"], device="cpu")
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 320, 19)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    assert_close(m.logits(ids), want)
    assert m.generate(ids[:5], 8) == GPT2.from_pretrained(files["hf"], device="cpu").generate(ids[:5], 8)


def test_q8_gguf_equals_safetensors_quantized_at_load(files, source) -> None:
    cpu = wt.Device.cpu()
    ids = [int(i) for i in np.random.default_rng(1).integers(0, 320, 17)]
    # float compute: the GGUF's q8_0 dequantized == safetensors through webtensor's q8_0 at load
    arrays = {}
    for name, arr in source.items():
        if held_in_q8(name):
            q = quant.quantize(arr if name == "wte.weight" else arr.T, "Q8_0").dequantize()
            arr = q if name == "wte.weight" else q.T
        arrays[name] = arr
    g = GPT2.from_pretrained(files["q8_0"], device=cpu)
    st = GPT2.from_arrays(g.config, arrays, cpu)
    assert np.array_equal(g.logits(ids), st.logits(ids))
    # dtype="int8": the same Q8_0 weights, handed through from the GGUF or quantized from safetensors
    gi = GPT2.from_pretrained(files["q8_0"], device=cpu, dtype="int8")
    si = GPT2.from_pretrained(files["hf"], device=cpu, dtype="int8")
    assert gi.quant == si.quant == "q8_0"
    pairs = [(gi.wte, si.wte)] + [(a, b) for bg, bs in zip(gi.blocks, si.blocks, strict=True)
                                  for a, b in zip(bg, bs, strict=True)]
    n_q8 = 0
    for a, b in pairs:
        if isinstance(a, quant.Quantized):
            assert isinstance(b, quant.Quantized) and a.qtype == b.qtype == "Q8_0" and a.shape == b.shape
            assert np.array_equal(a.to_blocks(), b.to_blocks())
            n_q8 += 1
        else:
            assert np.array_equal(a.numpy(), b.numpy())
    assert n_q8 == 1 + 4 * g.config.n_layer
    assert gi.blocks[0].attn_w.shape == (3 * 64, 64)  # (N, K): out x in


def test_directory_with_one_gguf(files, tmp_path) -> None:
    (tmp_path / "m.gguf").write_bytes(files["f16"].read_bytes())
    m = GPT2.from_pretrained(tmp_path, device="cpu")
    assert m.config.n_layer == 2 and m.tokenizer is not None
    (tmp_path / "n.gguf").write_bytes(b"")
    with pytest.raises(CheckpointError, match="several GGUF files"):
        GPT2.from_pretrained(tmp_path, device="cpu")


# -- bad files ------------------------------------------------------------------------------------
@pytest.mark.parametrize("reader", READERS)
def test_truncated_and_corrupt_files_refused(files, tmp_path, reader) -> None:
    data = files["q8_0"].read_bytes()
    start = GGUFFile.from_path(files["q8_0"]).data_offset  # where the tensor data begins
    bad = tmp_path / "bad.gguf"
    for cut in (0, 3, 10, 30, 200, start - 5, start + 100, len(data) - 1):
        bad.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=r"bad\.gguf.*(truncated|not a valid GGUF)"):
            open_checkpoint(bad, reader=reader)
    bad.write_bytes(b"GGML" + data[4:])
    with pytest.raises(CheckpointError, match="not a valid GGUF"):
        open_checkpoint(bad, reader=reader)
    with pytest.raises(CheckpointError, match="does not exist"):
        open_checkpoint(tmp_path / "nope.gguf", reader=reader)


@pytest.mark.parametrize("reader", READERS)
def test_unsupported_quant_type_named(files, tmp_path, reader) -> None:
    f = write_gguf(files["hf"], tmp_path / "i8.gguf", "i8")
    with pytest.raises(CheckpointError, match=r"'token_embd.weight' is stored as I8; webtensor reads F32, F16"):
        open_checkpoint(f, reader=reader)


@pytest.mark.parametrize(("kw", "match"), [
    (dict(metadata={"gpt2.block_count": None}), "'gpt2.block_count' is missing"),
    (dict(metadata={"gpt2.attention.head_count": 3}), "multiple of head_count=3"),
    (dict(metadata={"gpt2.feed_forward_length": 100}), "n_inner = 100 but tensor 'h.0.mlp.c_fc.weight' has shape"),
    (dict(metadata={"gpt2.context_length": "many"}), "'gpt2.context_length' should be int"),
    (dict(skip=("blk.1.ffn_down.weight",)), r"'h.1.mlp.c_proj.weight' \(blk.1.ffn_down.weight\) is missing"),
    (dict(metadata={"gpt2.embedding_length": 32, "gpt2.feed_forward_length": 128}), "has shape"),
    (dict(extra={"blk.0.attn_q.weight": np.zeros((64, 64))}), "'blk.0.attn_q.weight' is not part of a gpt2 model"),
])
def test_bad_contents_refused(files, tmp_path, kw, match) -> None:
    f = write_gguf(files["hf"], tmp_path / "bad.gguf", "f32", **kw)
    with pytest.raises(CheckpointError, match=match):
        GPT2.from_pretrained(f, device="cpu")


def test_an_output_of_its_own_unties_the_head(files, tmp_path) -> None:
    """A GGUF file whose `output.weight` is not a copy of `token_embd.weight` has an LM head of its own (as llama.cpp
    reads it), whatever tie the family assumes."""
    row = np.random.default_rng(5).standard_normal(64)  # (every row of the head this one: one logit a position)
    f = write_gguf(files["hf"], tmp_path / "untied.gguf", "f32", skip=("output.weight",),
                   extra={"output.weight": np.tile(row, (320, 1))})
    m = GPT2.from_pretrained(f, device="cpu")
    assert m.config.tie_word_embeddings is False
    logits = m.logits([1, 2, 3])
    assert np.abs(logits[:, 0]).min() > 0.1  # (a random row: no cancellation to near zero)
    assert_close(logits, np.broadcast_to(logits[:, :1], logits.shape))


def test_wrong_architecture_and_tokenizer_refused(files, tmp_path) -> None:
    with pytest.raises(CheckpointError, match="'llama.embedding_length' is missing"):
        open_checkpoint(write_gguf_metadata(tmp_path / "llama.gguf", {}, "llama"))
    with pytest.raises(CheckpointError, match="general.architecture 'bert' is not supported"):
        open_checkpoint(write_gguf_metadata(tmp_path / "bert.gguf", {}, "bert"))
    f = write_gguf(files["hf"], tmp_path / "spm.gguf", "f32", metadata={"tokenizer.ggml.model": "llama"})
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model is 'llama'"):
        open_checkpoint(f)

