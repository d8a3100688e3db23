"""Every GPT2Config field and every tensor a GPT-2 checkpoint may hold: implemented (parity with
Hugging Face's GPT2LMHeadModel, on the CPU device and on WebGPU) or refused with a CheckpointError
naming the field and its value. Tiny models (n_embd 32, 2 layers) keep this fast."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent.parent))
from gpt2_fixtures import make_checkpoint, make_tokenizer  # noqa: E402

import webtensor as wt  # noqa: E402
from webtensor.models.gpt2 import GPT2  # noqa: E402
from webtensor.models.gpt2.config import ACTIVATIONS, FIELDS, GPT2Config  # noqa: E402
from webtensor.runtime.runner import RunRow  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.hf  # the parity tier (needs torch and transformers)

BASE = dict(vocab_size=300, n_embd=32, n_layer=2, n_head=2, n_positions=64)

# options webtensor implements: GPT2Config overrides, each checked against HF
OPTIONS = {
    "untied-lm-head": dict(tie_word_embeddings=False),
    "gelu-erf": dict(activation_function="gelu"),
    "gelu-pytorch-tanh": dict(activation_function="gelu_pytorch_tanh"),
    "relu": dict(activation_function="relu"),
    "silu": dict(activation_function="silu"),
    "quick-gelu": dict(activation_function="quick_gelu"),
    "mish": dict(activation_function="mish"),
    "layer-norm-eps": dict(layer_norm_epsilon=0.3),
    "n-inner": dict(n_inner=48),
    "no-attn-scale": dict(scale_attn_weights=False),
    "inverse-layer-idx": dict(scale_attn_by_inverse_layer_idx=True),
    "reorder-and-upcast": dict(reorder_and_upcast_attn=True),
    "all-at-once": dict(tie_word_embeddings=False, activation_function="relu", n_inner=40, scale_attn_weights=False,
                        scale_attn_by_inverse_layer_idx=True, layer_norm_epsilon=1e-3),
}


@pytest.fixture(scope="module", params=list(OPTIONS))
def option(request, tmp_path_factory):
    d = make_checkpoint(tmp_path_factory.mktemp(request.param), **BASE, **OPTIONS[request.param])
    # eager attention: the implementation in which reorder_and_upcast_attn takes effect
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(d), attn_implementation="eager").eval()
    return d, hf


def hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].double().numpy()


def hf_greedy(hf, ids, n):
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
                          attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


def assert_logits_close(got, want):
    # rtol 1e-4, against the logits' scale (single logits near 0 have no relative precision)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


IDS = [5, 77, 260, 12, 9, 140, 33]


@pytest.mark.parametrize("kind", ["cpu", "wgpu"])
def test_option_matches_hf(option, kind, gpu):
    d, hf = option
    dev = wt.Device.cpu() if kind == "cpu" else gpu
    m = GPT2.from_pretrained(d, device=dev, kv_dtype="float32")
    want = hf_logits(hf, IDS)
    assert_logits_close(m.logits(IDS), want)
    greedy = hf_greedy(hf, IDS, 12)
    assert len(set(greedy)) > 2  # the continuation varies: a real check of the decode path
    assert m.generate(IDS, 12, stop_at_eos=False) == greedy
    # the captured decode step (greedy above replays it) gives the same logits
    runner = m.runner(1, bucketed=False)
    runner.prefill(0, IDS[:-1])
    got = runner.collect(runner.launch([RunRow(0, (IDS[-1],), len(IDS) - 1, read_logits=True)]))
    assert_logits_close(got.logits[0], want[-1])
    runner.close()


def test_page_loader_implements_the_same(tmp_path, gpu):
    """The page's loader (the pure-Python readers) reads the same config and weights."""
    opts = OPTIONS["all-at-once"]
    d = make_checkpoint(tmp_path / "c", **BASE, **opts)
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(d)).eval()
    m = wt.load_model(d, gpu, "float32", reader="pure")
    assert m.generate(IDS, 10, stop_at_eos=False) == hf_greedy(hf, IDS, 10)


# -- activations: the fused linear epilogue against HF's ACT2FN ------------------------------------


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([0.01, 1.0, 6.0, 40.0]), rows=st.sampled_from([3, 20]))
def test_every_activation_matches_hf(gpu, seed, scale, rows):
    from transformers.activations import ACT2FN

    x = (np.random.default_rng(seed).standard_normal((rows, 16)) * scale).astype(np.float32)
    eye = np.eye(16, dtype=np.float32)
    for hf_name, ours in ACTIVATIONS.items():
        want = ACT2FN[hf_name](torch.tensor(x, dtype=torch.float64)).numpy()
        for dev in (wt.Device.cpu(), gpu):
            got = wt.linear(wt.tensor(x, device=dev), wt.tensor(eye, device=dev), act=ours).numpy()
            err = np.abs(got - want) / np.maximum(np.abs(want), 1e-3)
            assert err.max() <= 1e-5, (hf_name, dev.kind, x.flat[err.argmax()], got.flat[err.argmax()])


# -- the table of fields ---------------------------------------------------------------------------


def test_table_covers_every_gpt2config_field(tmp_path):
    keys = set(transformers.GPT2Config().to_dict())
    transformers.GPT2Config(n_layer=1).save_pretrained(str(tmp_path))
    keys |= set(json.loads((tmp_path / "config.json").read_text()))
    assert keys - set(FIELDS) == set()
    assert {f.kind for f in FIELDS.values()} == {"used", "checked", "ignored"}
    assert all(f.note for f in FIELDS.values())
    from transformers.activations import ACT2CLS

    assert set(ACT2CLS) >= set(ACTIVATIONS)


def test_ignored_fields_do_not_change_the_output(tmp_path, cpu):
    d = make_checkpoint(tmp_path / "c", **BASE)
    base = GPT2.from_pretrained(d, device=cpu).logits(IDS)
    cfg = json.loads((d / "config.json").read_text())
    noise = {k: v for k, v in dict(
        resid_pdrop=0.9, embd_pdrop=0.9, attn_pdrop=0.9, initializer_range=7.0, summary_type="mean",
        summary_use_proj=False, summary_activation="tanh", summary_first_dropout=0.5, use_cache=False,
        pad_token_id=3, do_sample=True, temperature=0.1, top_k=2, architectures=["GPT2DoubleHeadsModel"],
        output_hidden_states=True, task_specific_params={"text-generation": {"max_length": 5}}, dtype="bfloat16",
        n_ctx=64, chunk_size_feed_forward=4).items()}
    assert all(FIELDS[k].kind in ("ignored", "checked") or k == "n_ctx" for k in noise)
    (d / "config.json").write_text(json.dumps({**cfg, **noise}))
    np.testing.assert_array_equal(GPT2.from_pretrained(d, device=cpu).logits(IDS), base)


def test_eos_list_stops_at_any(tmp_path, cpu):
    d = make_checkpoint(tmp_path / "c", **BASE)
    free = GPT2.from_pretrained(d, device=cpu).generate(IDS, 12, stop_at_eos=False)
    stop = next(t for t in free[3:] if t not in free[:3])  # a token first generated at step k >= 3
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "eos_token_id": [299, stop]}))
    m = GPT2.from_pretrained(d, device=cpu)
    assert m.config.eos_ids == {299, stop}
    assert m.generate(IDS, 12) == free[:free.index(stop) + 1]


def test_ignored_tensors_and_prefixes(tmp_path, cpu):
    """Old checkpoints' mask buffers (attn.bias, attn.masked_bias), a DoubleHeads multiple-choice
    head, and keys without the "transformer." prefix load; the logits are those of HF."""
    from safetensors.numpy import load_file, save_file

    d = make_checkpoint(tmp_path / "c", **BASE)
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(d)).eval()
    ts = {k.removeprefix("transformer."): v for k, v in load_file(str(d / "model.safetensors")).items()}
    P = BASE["n_positions"]
    for i in range(BASE["n_layer"]):
        ts[f"h.{i}.attn.bias"] = np.tril(np.ones((P, P), np.float32))[None, None]
        ts[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    ts["multiple_choice_head.summary.weight"] = np.zeros((1, 32), np.float32)
    save_file(ts, str(d / "model.safetensors"))
    assert_logits_close(GPT2.from_pretrained(d, device=cpu).logits(IDS), hf_logits(hf, IDS))


# -- refusals --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("base"), **BASE)


def _config(**kv):
    def edit(d):
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(kv)
        (d / "config.json").write_text(json.dumps(cfg))
    return edit


def _tensors(fn):
    def edit(d):
        from safetensors.numpy import load_file, save_file

        ts = load_file(str(d / "model.safetensors"))
        fn(ts)
        save_file(ts, str(d / "model.safetensors"))
    return edit


def _bigger_tokenizer(d):
    make_tokenizer(d, 400)  # 400 ids for an embedding of 300 rows


REFUSALS = {
    "cross-attention": (_config(add_cross_attention=True), r"add_cross_attention = true is not supported"),
    "encoder-decoder": (_config(is_encoder_decoder=True), r"is_encoder_decoder = true is not supported"),
    "pruned-heads": (_config(pruned_heads={"0": [1]}), r'pruned_heads = \{"0": \[1\]\} is not supported'),
    "quantized": (_config(quantization_config={"quant_method": "gptq"}), r"quantization_config = .* not supported"),
    "custom-code": (_config(auto_map={"AutoModel": "x.Y"}), r"auto_map = .* is not supported"),
    "unknown-key": (_config(rotary_dim=8), r"unknown key 'rotary_dim' = 8"),
    "prelu": (_config(activation_function="prelu"), r"activation_function 'prelu' is not supported"),
    "xielu": (_config(activation_function="xielu"), r"activation_function 'xielu' is not supported"),
    "unknown-act": (_config(activation_function="gelu_fancy"), r"activation_function 'gelu_fancy' is not supported"),
    "bool-type": (_config(scale_attn_weights="yes"), r"scale_attn_weights must be true or false, got 'yes'"),
    "n-ctx": (_config(n_ctx=128), r"n_ctx = 128 disagrees with n_positions = 64"),
    "eos-range": (_config(eos_token_id=300), r"eos_token_id = 300 is out of range for vocab_size = 300"),
    "eos-list-range": (_config(eos_token_id=[1, 999]), r"eos_token_id = \[1, 999\] is out of range"),
    "bos-range": (_config(bos_token_id=-1), r"bos_token_id = -1 is out of range"),
    "n-layer": (_config(n_layer=3), r"n_layer = 3 but the checkpoint has 2 layers"),
    "n-embd": (_config(n_embd=48), r"n_embd = 48 but tensor 'wte\.weight' has shape \(300, 32\), i\.e\. n_embd = 32"),
    "vocab": (_config(vocab_size=310), r"vocab_size = 310 but tensor 'wte\.weight' has shape \(300, 32\)"),
    "positions": (_config(n_positions=80), r"n_positions = 80 but tensor 'wpe\.weight' has shape \(64, 32\)"),
    "n-inner": (_config(n_inner=64), r"n_inner = 64 but tensor 'h\.0\.mlp\.c_fc\.weight' has shape \(32, 128\), "
                                     r"i\.e\. n_inner = 128"),
    "untied-no-head": (_config(tie_word_embeddings=False), r"tensor 'lm_head\.weight' is missing"),
    "tied-head-differs": (_tensors(lambda ts: ts.update({"lm_head.weight": ts["transformer.wte.weight"] + 1})),
                          r"tie_word_embeddings = true, but the checkpoint's lm_head\.weight differs"),
    "extra-tensor": (_tensors(lambda ts: ts.update({"score.weight": np.zeros((2, 32), np.float32)})),
                     r"tensors a GPT-2 LM does not have: 'score\.weight'"),
    "twice-stored": (_tensors(lambda ts: ts.update({"ln_f.bias": ts["transformer.ln_f.bias"]})),
                     r"tensor 'ln_f\.bias' is stored twice"),
    "tokenizer-vocab": (_bigger_tokenizer, r"the tokenizer has 400 token ids but config\.json's vocab_size = 300"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_with_the_field_named(case, base_ckpt, tmp_path, gpu):
    edit, pattern = REFUSALS[case]
    d = tmp_path / "c"
    shutil.copytree(base_ckpt, d)
    edit(d)
    with pytest.raises(wt.CheckpointError, match=pattern):
        GPT2.from_pretrained(d, device="cpu")
    with pytest.raises(wt.CheckpointError, match=pattern):  # the page refuses it alike
        wt.load_model(d, gpu, "float32", reader="pure")


def test_padded_embedding_is_fine(tmp_path, cpu):
    d = make_checkpoint(tmp_path / "c", **BASE)
    make_tokenizer(d, 280)  # fewer ids than the 300 embedding rows
    assert GPT2.from_pretrained(d, device=cpu).tokenizer.vocab_size <= 280


@settings(max_examples=25, deadline=None)
@given(key=st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=12),
       value=st.one_of(st.integers(), st.booleans(), st.text(max_size=5)))
def test_unknown_keys_are_refused_by_name(key, value):
    raw = dict(vocab_size=300, n_embd=32, n_layer=2, n_head=2)
    if key in FIELDS:
        return
    with pytest.raises(wt.CheckpointError, match=f"unknown key {key!r}"):
        GPT2Config.from_dict({**raw, key: value})


@settings(max_examples=25, deadline=None)
@given(layer=st.integers(0, 47), scale=st.booleans(), inverse=st.booleans(), n_head=st.sampled_from([1, 2, 4, 8]))
def test_attn_scale_is_hf_scaling(layer, scale, inverse, n_head):
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    kw = dict(n_embd=32, n_head=n_head, scale_attn_weights=scale, scale_attn_by_inverse_layer_idx=inverse)
    hf = GPT2Attention(transformers.GPT2Config(n_layer=48, **kw), layer_idx=layer)
    assert GPT2Config.from_dict(dict(vocab_size=10, n_layer=48, **kw)).attn_scale(layer) == pytest.approx(hf.scaling)


def test_released_checkpoints_configs_are_accepted():
    """The keys of openai-community/gpt2-medium's and distilgpt2's config.json (legacy ones included)."""
    raw = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
           "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
           "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 1024, "n_head": 16,
           "n_layer": 24, "n_positions": 1024, "n_special": 0, "predict_special_tokens": True, "resid_pdrop": 0.1,
           "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
           "summary_type": "cls_index", "summary_use_proj": True, "_num_labels": 1, "id2label": {"0": "LABEL_0"},
           "label2id": {"LABEL_0": 0}, "vocab_size": 50257,
           "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}}}
    cfg = GPT2Config.from_dict(raw)
    assert (cfg.n_layer, cfg.inner_dim, cfg.act, cfg.eos_ids) == (24, 4096, "gelu_tanh", {50256})
    assert cfg.attn_scale(5) == pytest.approx(64 ** -0.5)
