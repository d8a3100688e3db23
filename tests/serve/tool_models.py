"""Random checkpoints of the families whose tool-call formats the server reads, each with its real chat template
(tests/data/chat_templates, as the model publishes it) and a tokenizer that has the family's special and added
tokens (the shipped byte-level BPE, its 4,096 ids, then the family's own: `<|im_start|>`, `<tool_call>`,
`<|python_tag|>`, `[TOOL_CALLS]`, ... as the real tokenizers mark them, special or not), so that the prompt is
the one the real model would read and the markers are single tokens, as they are there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "chat_templates"
BASE_VOCAB = 4096

# family -> (architecture variant (llama_fixtures.VARIANTS), template file, special tokens, other added tokens,
#            EOS tokens, BOS token)
_QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_QWEN_ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
FAMILIES: dict[str, tuple[str, str, list[str], list[str], list[str], str | None]] = {
    "qwen2.5": ("qwen2", "Qwen-Qwen2.5-7B-Instruct.jinja", _QWEN_SPECIAL, _QWEN_ADDED, ["<|im_end|>"], None),
    "qwen3": ("qwen3", "Qwen-Qwen3-0.6B.jinja", _QWEN_SPECIAL, _QWEN_ADDED, ["<|im_end|>"], None),
    "qwen3.5": ("qwen3", "Qwen3.5-4B.jinja", _QWEN_SPECIAL, _QWEN_ADDED, ["<|im_end|>"], None),
    "hermes3": ("llama-gqa", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
                ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"],
                ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"], ["<|im_end|>"],
                "<|begin_of_text|>"),
    "llama3.1": ("llama3-rope", "meta-llama-Llama-3.1-8B-Instruct.jinja",
                 ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|eom_id|>", "<|python_tag|>"], [], ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
                 "<|begin_of_text|>"),
    "llama3.2": ("llama3-rope", "meta-llama-Llama-3.2-3B-Instruct.jinja",
                 ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|eom_id|>", "<|python_tag|>"], [], ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
                 "<|begin_of_text|>"),
    "mistral-nemo": ("mistral", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                     ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                      "[TOOL_RESULTS]", "[/TOOL_RESULTS]"], [], ["</s>"], "<s>"),
    "mistral-small-3.2": ("mistral", "Mistral-Small-3.2-24B-Instruct-2506.jinja",
                          ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                           "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]",
                           "[/SYSTEM_PROMPT]", "[ARGS]", "[CALL_ID]", "[TOOL_CONTENT]"], [], ["</s>"], "<s>"),
}


def make_family(out: Path, family: str, seed: int = 0, n_ctx: int = 2048) -> Path:
    """A random checkpoint of `family` (FAMILIES) in `out`, served under the directory's name (transformers writes
    the weights: the `hf` tier)."""
    from llama_fixtures import make_llama

    variant = FAMILIES[family][0]
    ids, eos_ids, bos_id = token_ids(family)
    make_llama(out, variant, seed=seed, vocab_size=BASE_VOCAB + len(ids) - 1, max_position_embeddings=n_ctx,
               bos_token_id=bos_id, eos_token_id=eos_ids[0])
    write_tokenizer(out, family, n_ctx)
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": bos_id, "eos_token_id": eos_ids}))
    return out


def token_ids(family: str) -> tuple[dict[str, int], list[int], int]:
    """The family's tokens' ids (the shipped `<|endoftext|>` kept at 0, the others from 4,096 on), its EOS ids and
    its BOS id (where it has none: the first EOS)."""
    _, _, special, added, eos, bos = FAMILIES[family]
    extra = [t for t in (*special, *added) if t != "<|endoftext|>"]
    ids = {"<|endoftext|>": 0, **{tok: BASE_VOCAB + i for i, tok in enumerate(extra)}}
    eos_ids = [ids[e] for e in eos]
    return ids, eos_ids, ids[bos] if bos else eos_ids[0]


def write_tokenizer(out: Path, family: str, n_ctx: int = 2048) -> Path:
    """The family's tokenizer files in `out` (tokenizer.json: the shipped BPE and the family's tokens; its
    tokenizer_config.json with the chat template): what the tests that need no weights load."""
    from llama_fixtures import SHIPPED

    out.mkdir(parents=True, exist_ok=True)
    _, template, special, _, eos, bos = FAMILIES[family]
    ids, _, _ = token_ids(family)
    tok = json.loads((SHIPPED / "tokenizer.json").read_text())
    tok["added_tokens"] = [*tok["added_tokens"], *({"id": i, "content": t, "single_word": False, "lstrip": False,
                                                     "rstrip": False, "normalized": False, "special": t in special}
                                                    for t, i in ids.items() if i)]
    (out / "tokenizer.json").write_text(json.dumps(tok))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos[0],
                              "bos_token": bos, "model_max_length": n_ctx,
                              "chat_template": (TEMPLATES / template).read_text()}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": eos[0], "bos_token": bos}))
    for f in ("vocab.json", "merges.txt"):
        (out / f).unlink(missing_ok=True)
    return out
