"""`formats.gguf_writer`: a HF checkpoint written as GGUF through the gguf package's writer (what `webtensor web`
serves the page for int8), here GPT-2's. Read back by the gguf package and the pure reader: the q8_0 tensors are
bit for bit the native q8_0 model's quantization at load, the floats the checkpoint's, config and tokenizer the
same; f16 / f32 outtypes; bad input refused. (The Llama family's files: tests/models/test_llama_vs_hf.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from gpt2_fixtures import make_checkpoint  # noqa: E402

import webtensor as wt  # noqa: E402
from webtensor.formats.gguf_writer import gguf_bytes, write_gguf  # noqa: E402
from webtensor.models.gpt2 import GPT2  # noqa: E402
from webtensor.models.gpt2.names import gguf_name  # noqa: E402
from webtensor.models.loader import open_checkpoint  # noqa: E402
from webtensor.quant import quantize  # noqa: E402
from webtensor.text.tokenizer import GPT2Tokenizer  # noqa: E402


def held_in_q8(name: str) -> bool:
    return name == "wte.weight" or (name.startswith("h.") and name.endswith(
        ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")))

pytest.importorskip("gguf")
TEXT = "Hello world, it is a truth universally acknowledged <|endoftext|> again"


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # n_embd 96: three blocks a row (an odd count) in the attention matrices
    return make_checkpoint(tmp_path_factory.mktemp("w") / "hf", vocab_size=300, n_embd=96, n_layer=2, n_head=2)


@pytest.mark.parametrize("reader", ["gguf", "pure"])
@pytest.mark.parametrize("outtype", ["q8_0", "f16", "f32"])
def test_written_file_reads_back(hf: Path, tmp_path: Path, outtype: str, reader: str) -> None:
    path = write_gguf(hf, tmp_path / f"m.{outtype}.gguf", outtype)
    ck = open_checkpoint(path, reader=reader)
    src = open_checkpoint(hf)
    want_type = {"q8_0": "Q8_0", "f16": "F16", "f32": "F32"}[outtype]
    assert ck.names == src.names
    for name in ck.names:
        assert ck.stored_type(name) == (want_type if held_in_q8(name) else "F32"), name
        if outtype == "q8_0" and held_in_q8(name):
            ref = src.array(name)
            ref = quantize(ref if name == "wte.weight" else np.ascontiguousarray(ref.T), "Q8_0")  # (N, K)
            assert bytes(ck.raw(name)) == ref.to_blocks().tobytes(), name  # the native q8_0 weights, bit for bit
        else:
            ref = src.array(name)
            got = ck.array(name)
            ref = ref.astype(np.float16) if outtype == "f16" and held_in_q8(name) else ref
            assert np.array_equal(got, ref), name
    cfg = GPT2.from_pretrained(hf, device=wt.Device.cpu()).config
    assert ck.family.name == "gpt2"
    assert (ck.config.n_layer, ck.config.n_embd, ck.config.n_head, ck.config.n_positions, ck.config.vocab_size) == (
        cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_positions, cfg.vocab_size)
    assert ck.config.layer_norm_epsilon == pytest.approx(cfg.layer_norm_epsilon)
    assert ck.tokenizer.encode(TEXT) == GPT2Tokenizer.from_dir(hf).encode(TEXT)


def test_int8_model_from_the_file_is_the_int8_model(hf: Path, tmp_path: Path) -> None:
    """GPT2 int8 from the written q8_0 GGUF and from the safetensors: the same logits, exactly."""
    path = write_gguf(hf, tmp_path / "m.gguf")
    ids = GPT2Tokenizer.from_dir(hf).encode(TEXT)
    a = GPT2.from_pretrained(path, device=wt.Device.cpu(), dtype="int8").logits(ids)
    b = GPT2.from_pretrained(hf, device=wt.Device.cpu(), dtype="int8").logits(ids)
    assert np.array_equal(a, b)


def test_bytes_and_size(hf: Path) -> None:
    data = gguf_bytes(hf)
    assert data[:4] == b"GGUF"
    ck_f32 = (hf / "model.safetensors").stat().st_size
    # the matrices at 34/32 bytes a value instead of 4; the rest (biases, wpe, metadata) float
    assert len(data) < 0.45 * ck_f32


def test_names() -> None:
    assert gguf_name("h.3.mlp.c_fc.weight") == "blk.3.ffn_up.weight"
    assert gguf_name("wte.weight") == "token_embd.weight" and gguf_name("ln_f.bias") == "output_norm.bias"
    assert gguf_name("lm_head.weight") == "output.weight"


def test_tensor_types_override_the_outtype(hf: Path, tmp_path: Path) -> None:
    """tensor_types (llama-quantize's --tensor-type): the first pattern found in a matrix's GGUF name gives its type
    (the package's quantizer for the 32-value types, the caller's blocks for K-quant / IQ4 ones, llama.cpp's fallback
    where rows are not whole 256-value blocks), norms and biases stay F32; the file loads with those types."""
    from webtensor import quant

    rng = np.random.default_rng(0)
    path = write_gguf(hf, tmp_path / "m.gguf", "q8_0", kquant_blocks=lambda t, n, k: quant.random_weight(
        t, (n, k), rng).blocks, tensor_types={r"blk\.0\.attn_qkv": "q4_0", "ffn_down": "Q5_K", r"^blk\.": "f16",
                                                 "token_embd": "IQ4_NL"})
    ck = open_checkpoint(path, reader="pure")
    src = open_checkpoint(hf)
    assert ck.stored_type("h.0.attn.c_attn.weight") == "Q4_0"  # (the first pattern that matches)
    want = quantize(np.ascontiguousarray(src.array("h.0.attn.c_attn.weight").T), "Q4_0")
    assert bytes(ck.raw("h.0.attn.c_attn.weight")) == want.to_blocks().tobytes()
    assert ck.stored_type("h.1.attn.c_attn.weight") == ck.stored_type("h.0.mlp.c_fc.weight") == "F16"
    assert ck.stored_type("h.1.mlp.c_proj.weight") == "Q5_1"  # Q5_K's fallback: rows of 384 values
    assert ck.stored_type("wte.weight") == "IQ4_NL"  # (random blocks: rows of 96 values, three blocks)
    assert ck.stored_type("h.0.ln_1.weight") == ck.stored_type("h.0.attn.c_attn.bias") == "F32"
    m = wt.load_model(path, "cpu")
    assert m.params["wte.weight"].qtype == "IQ4_NL" and len(m.generate([1, 2, 3], 3, stop_at_eos=False)) == 3


def test_bad_input_refused(hf: Path, tmp_path: Path) -> None:
    with pytest.raises(wt.ArgumentError, match="outtype"):
        write_gguf(hf, tmp_path / "x.gguf", "q5_0")
    with pytest.raises(wt.ArgumentError, match="^tensor type attn=q9_k: not one of F32, F16, BF16, Q8_0"):
        write_gguf(hf, tmp_path / "x.gguf", tensor_types={"attn": "q9_k"})
    with pytest.raises(wt.ArgumentError, match=r"^tensor type \(attn=q4_0: the pattern is not a regular expression"):
        write_gguf(hf, tmp_path / "x.gguf", tensor_types={"(attn": "q4_0"})
    with pytest.raises(wt.ArgumentError, match="need their blocks from the caller"):
        write_gguf(hf, tmp_path / "x.gguf", tensor_types={"attn": "q4_k"})
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in hf.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "model.safetensors").write_bytes((hf / "model.safetensors").read_bytes()[:3000])
    with pytest.raises(wt.CheckpointError, match="safetensors"):
        write_gguf(bad, tmp_path / "y.gguf")
