"""The real SmolLM2-135M-Instruct GGUF file's tokenizer (`tokenizer.ggml.pre` "smollm", 49,152 tokens),
on both paths, against transformers reading the same file.

transformers' GGUF reader maps no pre-tokenizer for "smollm": it splits with GPT-2's regex alone. llama.cpp
(llama-vocab.cpp: `\\p{N}` first, then GPT-2's regex) and SmolLM2's own tokenizer.json
(Sequence[Digits(individual_digits=True), ByteLevel]) put every number on its own first, which matters
where a run of whitespace precedes a number ("a  1": [a, ĠĠ, 1], not [a, Ġ, Ġ, 1]). The reference is
therefore transformers' tokenizer of the file with SmolLM2's pre-tokenizer set, and plain transformers
must agree on every text without a number."""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytestmark = pytest.mark.hf  # against transformers (the parity tier)

from smollm2 import smollm2_gguf  # noqa: E402
from text_fixtures import corpus  # noqa: E402

from webtensor.text.tokenizer import Tokenizer  # noqa: E402

TEXTS = corpus()


@pytest.fixture(scope="module")
def smollm2() -> dict[str, Any]:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    from webtensor.formats.gguf_pure import GGUFFile

    path = smollm2_gguf()
    meta = GGUFFile.from_path(path).metadata
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ref = HFTokenizer.from_str(hf.backend_tokenizer.to_str())  # transformers' tokenizer of the file ...
    ref.pre_tokenizer = pre_tokenizers.Sequence([  # ... with SmolLM2's pre-tokenizer
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    ours = [Tokenizer.from_gguf_metadata(meta, str(path), native=native) for native in (False, True)]
    return {"meta": meta, "hf": hf, "ref": ref, "ours": ours}


def _has_number(text: str) -> bool:
    return any(unicodedata.category(c)[0] == "N" for c in text)


def test_ids_equal_transformers(smollm2: dict[str, Any]) -> None:
    hf, ref = smollm2["hf"], smollm2["ref"]
    assert {t.kind for t in smollm2["ours"]} == {"pure-python", "tokenizers"}
    differ = 0
    for text in TEXTS:
        want = ref.encode(text, add_special_tokens=False).ids
        assert ref.encode(text).ids == want  # SmolLM2 adds no BOS (tokenizer.ggml.add_bos_token false)
        for tok in smollm2["ours"]:
            assert tok.encode(text) == want, (tok.kind, text)
            assert tok.encode(text, add_special_tokens=True) == want, (tok.kind, text)
        plain = hf(text, add_special_tokens=False)["input_ids"]
        if not _has_number(text):
            assert plain == want, text
        differ += plain != want
    assert differ > 0  # the corpus does exercise the digit split


def test_decoding_equals_transformers(smollm2: dict[str, Any]) -> None:
    hf = smollm2["hf"]
    for text in TEXTS:
        ids = hf(text, add_special_tokens=False)["input_ids"]
        for tok in smollm2["ours"]:
            assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
            assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False), text
            assert "".join(tok.stream_decode(ids)) == tok.decode(ids)


def test_file_facts(smollm2: dict[str, Any]) -> None:
    hf = smollm2["hf"]
    for tok in smollm2["ours"]:
        assert tok.vocab_size == len(hf) == 49152
        assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>") == (hf.bos_token, hf.eos_token)
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
        assert tok.special_tokens_map == {k: v for k, v in hf.special_tokens_map.items() if isinstance(v, str)}
        assert not tok.add_bos_token
        assert tok.special_ids == frozenset(range(17))  # <|endoftext|> ... <empty_output>: control tokens
        # what a chat turn looks like, and that its special tokens never show as text
        ids = tok.encode("<|im_start|>user\nWhat is 2+2?<|im_end|>\n")
        assert ids[0] == 1 and 2 in ids
        assert tok.decode(ids) == "user\nWhat is 2+2?\n"


def test_gguf_pre_tokenizers_equal_llama_cpp(smollm2: dict[str, Any]) -> None:
    """The SmolLM2 vocabulary under each `tokenizer.ggml.pre` webtensor reads gives llama.cpp's ids
    (recorded by tools/llamacpp_token_ids.py with llama.cpp's llama-tokenize): its "smollm" digit split, the
    four isolating splits of "default", Llama 3's regex with ignore_merges for "llama-bpe" (and a BOS where
    the file does not say add_bos_token, as the SmolLM2 file does: false)."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).parent / "data" / "llamacpp_token_ids.json").read_text(encoding="utf-8"))
    assert doc["texts"] == TEXTS  # recorded on this corpus (rerun the tool after changing it)
    no_bos_key = "llama-bpe (no add_bos_token)"
    assert set(doc["ids"]) == {"smollm", "gpt-2", "default", "llama-bpe", "qwen2", no_bos_key}
    for variant, want in doc["ids"].items():
        pre = variant.split()[0]
        meta = {**smollm2["meta"], "tokenizer.ggml.pre": pre}
        if variant == no_bos_key:
            del meta["tokenizer.ggml.add_bos_token"]
        for native in (False, True):
            tok = Tokenizer.from_gguf_metadata(meta, variant, native=native)
            assert tok.add_bos_token == (variant == no_bos_key)
            for text, ids in zip(TEXTS, want, strict=True):
                assert tok.encode(text, add_special_tokens=True) == ids, (variant, tok.kind, text)
