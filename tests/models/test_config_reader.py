"""`webtensor.models.config_reader`: the typed reads every family's config parser and the loader share — the same
value is accepted or refused alike by GPT-2's and the Llama family's parsers, in config.json and in GGUF metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from webtensor.errors import CheckpointError
from webtensor.models.config_reader import GGUFMetadata, JSONConfig, read_json_object, token_id, token_ids
from webtensor.models.gpt2.config import GPT2Config
from webtensor.models.llama.config import LlamaConfig

GPT2 = dict(model_type="gpt2", vocab_size=16, n_embd=8, n_layer=1, n_head=2, n_positions=32)
LLAMA = dict(model_type="llama", vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)


def test_typed_reads():
    r = JSONConfig({"a": 32.0, "b": 3, "c": True, "n": None}, "c.json")
    assert (r.int("a"), r.float("b"), r.bool("c", False), r.int("n", None), r.int("absent", 7)) == (32, 3.0, True,
                                                                                                   None, 7)
    for read, key, want in ((r.int, "c", "an integer"), (r.float, "c", "a number")):
        with pytest.raises(CheckpointError, match=rf"^c\.json: a hyper-parameter has the wrong type: {key} must be "
                                                  rf"{want}, got True$"):
            read(key)
    with pytest.raises(CheckpointError, match=r"^c\.json lacks required key absent$"):
        r.int("absent")
    with pytest.raises(CheckpointError, match="n must be true or false, got None"):
        r.bool("n", True)
    assert JSONConfig({"n": None}, "c.json", null_as_default=True).bool("n", True) is True


def test_gguf_metadata_reads_under_the_architecture():
    m = GGUFMetadata({"qwen2.block_count": 4, "qwen2.context_length": "many", "tokenizer.ggml.tokens": ["a", "b"],
                      "tokenizer.ggml.eos_token_id": [1, 2]}, "qwen2", "f.gguf")
    assert (m.int("block_count"), m.vocab_size(), m.token_ids("tokenizer.ggml.eos_token_id")) == (4, 2, (1, 2))
    with pytest.raises(CheckpointError, match=r"^f\.gguf: metadata 'qwen2\.context_length' should be int, got 'many'$"):
        m.int("context_length")
    with pytest.raises(CheckpointError, match=r"^f\.gguf: metadata key 'qwen2\.embedding_length' is missing$"):
        m.int("embedding_length")
    with pytest.raises(CheckpointError, match=r"neither qwen2\.vocab_size nor tokenizer\.ggml\.tokens gives"):
        GGUFMetadata({}, "qwen2", "f.gguf").vocab_size()
    assert GGUFMetadata({"llama.vocab_size": 9, "tokenizer.ggml.tokens": ["a"]}, "llama", "f").vocab_size() == 9


@pytest.mark.parametrize(("v", "want"), [(None, ()), (3, (3,)), ([3, 4], (3, 4)), ([], ())])
def test_token_ids(v, want):
    assert token_ids(v, "eos_token_id", "c.json") == want
    if not isinstance(v, list):
        assert token_id(v, "eos_token_id", "c.json") == (want[0] if want else None)


@pytest.mark.parametrize(("v", "match"), [("end", "eos_token_id must be an integer token id or null, got 'end'"),
                                          (True, "must be an integer token id or null, got True"),
                                          ([1, None], r"must be a list of integer token ids, got \[1, None\]")])
def test_token_ids_refused(v, match):
    with pytest.raises(CheckpointError, match=match):
        token_ids(v, "eos_token_id", "c.json")


@pytest.mark.parametrize(("family", "base", "key"), [(GPT2Config.from_dict, GPT2, "n_layer"),
                                                      (LlamaConfig.from_hf, LLAMA, "num_hidden_layers")])
@pytest.mark.parametrize(("value", "match"), [("2", "must be an integer, got '2'"), (1.5, "must be an integer"),
                                              (True, "must be an integer, got True")])
def test_both_families_refuse_a_wrong_type_alike(family, base, key, value, match):
    with pytest.raises(CheckpointError, match=rf"^config\.json: a hyper-parameter has the wrong type: {key} {match}"):
        family({**base, key: value}, "config.json")


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_both_families_read_eos_lists(family):
    if family == "gpt2":
        cfg = GPT2Config.from_dict({**GPT2, "eos_token_id": [3, 5]})
    else:
        cfg = LlamaConfig.from_hf({**LLAMA, "eos_token_id": [3, 5]})
    assert cfg.spec.eos_ids == {3, 5}


def test_read_json_object(tmp_path: Path):
    f = tmp_path / "config.json"
    assert read_json_object(f, missing=None) == {}
    with pytest.raises(CheckpointError, match="config.json is missing: a checkpoint directory needs config.json"):
        read_json_object(f, missing="a checkpoint directory needs config.json")
    f.write_text("[1]")
    with pytest.raises(CheckpointError, match="must hold a JSON object, got list"):
        read_json_object(f, missing="x")
    f.write_text("{")
    with pytest.raises(CheckpointError, match="is not valid JSON"):
        read_json_object(f, missing="x")
    f.write_text(json.dumps(GPT2))
    assert read_json_object(f, missing="x") == GPT2


@pytest.mark.parametrize("name", ["llama", "gemma", "moe", "olmo2"])
def test_a_foreign_architecture_is_refused_by_name(name):
    """Each decoder family's parsers refuse another family's model_type / general.architecture with one line naming
    the key and the value (`decoder.config.architecture`), from config.json and from GGUF metadata alike."""
    from webtensor.models.registry import by_name
    family = by_name(name)
    with pytest.raises(CheckpointError, match=r"^c\.json: model_type 'gpt2' is not .+$"):
        family.config_from_hf(dict(GPT2), "c.json")
    with pytest.raises(CheckpointError, match=r"^f\.gguf: general\.architecture 'bert' is not .+$"):
        family.config_from_gguf({"general.architecture": "bert"}, [], "f.gguf")
