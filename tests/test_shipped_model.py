"""Sanity checks for the tiny GPT-2 shipped in ``webtensor/models/shipped``.

The checkpoint is produced by ``tools/train_tiny_gpt2.py``; these tests load it with the
reference implementation (Hugging Face ``transformers`` + ``torch``) so a broken or noisy
checkpoint is caught independently of the WebGPU runtime.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

SHIPPED = Path(__file__).resolve().parents[1] / "src" / "webtensor" / "models" / "shipped"
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "vocab.json", "merges.txt")
COMMON_WORDS = {
    "the", "and", "a", "to", "of", "was", "he", "she", "it", "in", "her", "his", "i", "you",
    "that", "had", "with", "for", "not", "be", "as", "is", "at", "on", "but", "by", "they",
    "all", "so", "have", "which", "would", "could", "said", "very", "there", "were", "been",
    "my", "me", "him", "them", "this", "from", "no", "an", "what", "one", "will", "more",
}


def test_files_present_and_small():
    for name in REQUIRED:
        assert (SHIPPED / name).is_file(), f"missing {name}"
    files = [p for p in SHIPPED.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix in (".bin", ".pt", ".pth", ".ckpt")], \
        "pickle checkpoints must not ship; use safetensors only"
    total = sum(p.stat().st_size for p in files)
    assert total < 10 * 1024 * 1024, f"shipped model dir is {total / 1e6:.1f} MB"


def test_config_sanity():
    cfg = json.loads((SHIPPED / "config.json").read_text())
    assert cfg["model_type"] == "gpt2"
    assert cfg.get("tie_word_embeddings", True) is True
    assert cfg["n_embd"] % cfg["n_head"] == 0
    assert cfg["n_positions"] >= 128
    vocab = json.loads((SHIPPED / "vocab.json").read_text())
    assert len(vocab) == cfg["vocab_size"]
    assert vocab["<|endoftext|>"] == cfg["eos_token_id"]


def test_safetensors_tied_embeddings():
    pytest.importorskip("safetensors", reason="safetensors not installed")
    pytest.importorskip("numpy", reason="numpy not installed")
    from safetensors import safe_open

    cfg = json.loads((SHIPPED / "config.json").read_text())
    with safe_open(str(SHIPPED / "model.safetensors"), framework="np") as f:
        keys = set(f.keys())
        wte = f.get_slice("transformer.wte.weight").get_shape()
    assert list(wte) == [cfg["vocab_size"], cfg["n_embd"]]
    # tied: the LM head is not stored separately
    assert "lm_head.weight" not in keys
    assert f"transformer.h.{cfg['n_layer'] - 1}.mlp.c_proj.weight" in keys


def test_tokenizer_round_trip():
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed")
    tok = tokenizers.Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))
    for s in ("Once upon a time", "  leading spaces\nand\ttabs ", "naïve café — “quotes” 日本語 🙂",
              "<|endoftext|>"):
        assert tok.decode(tok.encode(s).ids, skip_special_tokens=False) == s
    assert tok.token_to_id("<|endoftext|>") is not None


@pytest.mark.hf
def test_greedy_generation_is_english():
    torch = pytest.importorskip("torch", reason="torch not installed (reference check skipped)")
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed")

    torch.set_num_threads(1)
    model = transformers.GPT2LMHeadModel.from_pretrained(str(SHIPPED))
    model.eval()
    assert model.config.model_type == "gpt2"
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    tok = tokenizers.Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))

    ids = torch.tensor([tok.encode("Once upon a time").ids])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=20, do_sample=False,
                             pad_token_id=model.config.eos_token_id)
    assert out.shape[1] == ids.shape[1] + 20 or int(out[0, -1]) == model.config.eos_token_id
    text = tok.decode(out[0, ids.shape[1]:].tolist())
    letters = sum(c.isascii() and (c.isalpha() or c.isspace()) for c in text)
    assert letters >= 0.75 * len(text), f"mostly non-letters: {text!r}"
    words = set(re.findall(r"[a-z]+", text.lower()))
    assert len(words & COMMON_WORDS) >= 3, f"not recognisably English: {text!r}"
