"""GGUF files in llama.cpp's mixes (Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, IQ4_NL, IQ4_XS), of random K-quant / IQ4 blocks
(`formats.gguf_writer` with `kquant_blocks`, as tools/random_checkpoint.py writes them for the benchmarks): the
tensor types llama.cpp's quantizer chooses, webtensor against transformers reading the same file, lavapipe against
the CPU device, and the int8-activation GEMV (gemv_quant_dot4, forced on lavapipe) within the model-level bound
docs/numerics.md gives."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from conftest import set_policy  # noqa: E402
from llama_fixtures import make_llama  # noqa: E402
from tolerance import assert_close  # noqa: E402

import webtensor as wt  # noqa: E402
from webtensor import quant  # noqa: E402
from webtensor.models.base import LanguageModel  # noqa: E402

gguf = pytest.importorskip("gguf")
IDS = [int(i) for i in np.random.default_rng(8).integers(0, 4096, 19)]
DOT4_MODEL_TOL = 3e-2  # logits, norm-wise, int8 activations against float32 ones (docs/numerics.md)


@pytest.fixture(scope="module")
def q4km(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from webtensor.formats.gguf_writer import write_gguf

    root = tmp_path_factory.mktemp("kq")
    # rows of 256 and 512 values (whole K-quant blocks), 3 layers (the last takes Q6_K for attn_v / ffn_down)
    hf = make_llama(root / "hf", "llama-gqa", hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2)
    rng = np.random.default_rng(0)

    def blocks(qtype: str, n: int, k: int) -> np.ndarray:
        return quant.random_weight(qtype, (n, k), rng, {"Q4_K": -12, "Q6_K": -13}[qtype]).blocks

    return write_gguf(hf, root / "m.q4_k_m.gguf", "q4_k_m", kquant_blocks=blocks)


def test_types_are_llama_cpps_q4_k_m(q4km: Path) -> None:
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(q4km)).tensors}
    assert types["token_embd.weight"] == "Q4_K" and types["output.weight"] == "Q6_K"
    for i in range(3):
        for name in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert types[f"blk.{i}.{name}.weight"] == "Q4_K"
        for name in ("attn_v", "ffn_down"):
            assert types[f"blk.{i}.{name}.weight"] == ("Q6_K" if i == 2 else "Q4_K")
        assert types[f"blk.{i}.attn_norm.weight"] == "F32"


def test_q4_k_m_needs_its_blocks(tmp_path: Path) -> None:
    from webtensor.formats.gguf_writer import write_gguf

    with pytest.raises(wt.ArgumentError, match="q4_k_m needs llama.cpp's quantizer"):
        write_gguf(tmp_path / "none", tmp_path / "x.gguf", "q4_k_m")


# the other mixes: 3 layers, 4 query heads on 1 KV head (llama.cpp's n_gqa() >= 4 rules), ffn_down rows of 544
# values (not whole 256-blocks: llama.cpp's fallbacks), untied output
MIX_TYPES = {  # mix -> (most matrices, attn_v by layer, attn_output, ffn_down by layer)
    "q5_k_m": ("Q5_K", ("Q5_K", "Q5_K", "Q6_K"), "Q5_K", ("Q5_1", "Q5_1", "Q8_0")),
    "q3_k_m": ("Q3_K", ("Q5_K", "Q5_K", "Q4_K"), "Q4_K", ("Q5_0",) * 3),
    "q2_k": ("Q2_K", ("Q4_K",) * 3, "Q3_K", ("IQ4_NL",) * 3),
    "iq4_nl": ("IQ4_NL", ("Q5_K",) * 3, "IQ4_NL", ("IQ4_NL",) * 3),
    "iq4_xs": ("IQ4_XS", ("Q5_K",) * 3, "IQ4_XS", ("IQ4_NL",) * 3),
}


@pytest.fixture(scope="module", params=sorted(MIX_TYPES))
def mixed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    pytest.importorskip("transformers")
    from webtensor.formats.gguf_writer import write_gguf
    from webtensor.quant.weight import MODEL_LOG2_SCALE

    mix = request.param
    root = tmp_path_factory.mktemp(mix)
    hf = make_llama(root / "hf", "llama-gqa", hidden_size=256, intermediate_size=544, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=1)
    rng = np.random.default_rng(1)

    def blocks(qtype: str, n: int, k: int) -> np.ndarray:
        return quant.random_weight(qtype, (n, k), rng, MODEL_LOG2_SCALE[qtype]).blocks

    return mix, write_gguf(hf, root / f"m.{mix}.gguf", mix, kquant_blocks=blocks)


def test_types_are_llama_cpps_mix(mixed: tuple[str, Path]) -> None:
    mix, path = mixed
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    base, attn_v, attn_output, ffn_down = MIX_TYPES[mix]
    assert types["token_embd.weight"] == base and types["output.weight"] == "Q6_K"
    for i in range(3):
        for name in ("attn_q", "attn_k", "ffn_gate", "ffn_up"):
            assert types[f"blk.{i}.{name}.weight"] == base
        assert (types[f"blk.{i}.attn_v.weight"], types[f"blk.{i}.attn_output.weight"],
                types[f"blk.{i}.ffn_down.weight"]) == (attn_v[i], attn_output, ffn_down[i])


@pytest.mark.hf
def test_transformers_reads_the_same_mix(mixed: tuple[str, Path]) -> None:
    import torch
    import transformers

    path = mixed[1]
    m = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          dtype=torch.float32).eval()
    with torch.no_grad():
        want = m(torch.tensor([IDS])).logits[0].numpy()
    assert_close(wt.load_model(path, "cpu").logits(IDS), want, rtol=1e-5)


@pytest.mark.wgpu
def test_lavapipe_runs_the_mix_as_the_cpu(mixed: tuple[str, Path], gpu: wt.Device,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every type of the mix on lavapipe (lavapipe's policy: the f32 GEMV, the register-tiled kernel for the
    19-token prompt, the quantized embedding): the CPU device's logits and greedy tokens. Then the GPU kernels
    (gpu_style): the int8-activation GEMV for 1 and 5 tokens, the matrix engine's quantized tiles for 19, within
    DOT4_MODEL_TOL of the CPU device's logits. (The KV cache float32 on both: the GEMVs are what is compared.)"""
    _lavapipe_as_cpu_then_dot4(mixed[1], gpu, monkeypatch, n_gen=6, dot4_lens=(1, 5, 19))


@pytest.mark.hf
def test_transformers_reads_the_same_model(q4km: Path) -> None:
    """transformers dequantizes the K-quants with the gguf package, bit for bit webtensor's reference."""
    import torch
    import transformers

    m = transformers.AutoModelForCausalLM.from_pretrained(str(q4km.parent), gguf_file=q4km.name,
                                                          dtype=torch.float32).eval()
    with torch.no_grad():
        want = m(torch.tensor([IDS])).logits[0].numpy()
    assert_close(wt.load_model(q4km, "cpu").logits(IDS), want)  # (logits of a vocabulary: no floor)


@pytest.mark.wgpu
def test_lavapipe_equals_the_cpu_and_int8_activations_stay_close(q4km: Path, gpu: wt.Device,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The f32 GEMV (lavapipe's policy): the CPU device's logits and greedy tokens. The int8-activation GEMV, forced
    on with the GPU kernels (every product of a prompt of up to 8 tokens, and the decode steps): logits within
    DOT4_MODEL_TOL of the CPU device's. (The KV cache float32 on both: the GEMVs are what is compared.)"""
    dot4, cpu = _lavapipe_as_cpu_then_dot4(q4km, gpu, monkeypatch, n_gen=8, dot4_lens=(1, 5, 8))
    steps = dot4.generate(IDS[:6], 8, stop_at_eos=False)
    assert len(steps) == 8 and all(0 <= t < cpu.vocab_size for t in steps)


def _lavapipe_as_cpu_then_dot4(path: Path, gpu: wt.Device, monkeypatch: pytest.MonkeyPatch, n_gen: int,
                               dot4_lens: tuple[int, ...]) -> tuple[LanguageModel, LanguageModel]:
    """The model at `path` on lavapipe (its own policy) equals the CPU device's (logits, n_gen greedy tokens); then,
    the GPU kernels forced (gpu_style, the int8-activation GEMV), its logits of prompts of `dot4_lens` tokens stay
    within DOT4_MODEL_TOL of the CPU device's. Returns (the int8 model, the CPU model). (KV float32 on both: the
    GEMVs are what is compared.)"""
    cpu = wt.load_model(path, "cpu")
    gp = wt.load_model(path, gpu, kv_dtype="float32")
    assert_close(gp.logits(IDS), cpu.logits(IDS), rtol=1e-4)
    assert gp.generate(IDS[:6], n_gen, stop_at_eos=False) == cpu.generate(IDS[:6], n_gen, stop_at_eos=False)
    if not gpu.ctx.has_dot4:
        pytest.skip("this adapter's WGSL has no packed 4x8-bit integer dot products")
    set_policy(monkeypatch, gpu, gpu_style=True, gemv_quant_dot4=True)
    dot4 = wt.load_model(path, gpu, kv_dtype="float32")
    for n in dot4_lens:
        assert_close(dot4.logits(IDS[:n]), cpu.logits(IDS[:n]), rtol=DOT4_MODEL_TOL, what=n)
    return dot4, cpu


@pytest.mark.parametrize("mixed", ["q2_k"], indirect=True)  # (one mix file suffices: its Q3_K attn_output)
@pytest.mark.parametrize("reader", ["gguf", "pure"])
def test_rare_types_refused_naming_type_and_tensor(mixed: tuple[str, Path], tmp_path: Path, reader: str) -> None:
    """A tensor in a type webtensor does not run (IQ3_S here: the Q2_K mix's Q3_K attn_output relabelled, the same
    110 bytes a block) is refused at open, in one line naming the tensor and its type."""
    import struct

    _, path = mixed
    data = bytearray(path.read_bytes())
    name = b"blk.1.attn_output.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    at += 4 + 8 * n_dims  # the tensor's ggml type id
    assert struct.unpack_from("<I", data, at)[0] == gguf.GGMLQuantizationType.Q3_K
    struct.pack_into("<I", data, at, gguf.GGMLQuantizationType.IQ3_S)
    bad = tmp_path / "iq3_s.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(wt.CheckpointError, match=r"^[^\n]*iq3_s\.gguf: tensor 'blk\.1\.attn_output\.weight' is "
                                                 r"stored as IQ3_S; webtensor reads F32, [^\n]*IQ4_XS there$"):
        wt.load_model(bad, "cpu", reader=reader)
