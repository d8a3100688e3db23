"""Text for the tokenizer and chat tests: a Unicode corpus (tests/data/tokenizer_corpus.json: mixed
scripts, digits, emoji, whitespace runs, special-token text; plus the prose of heldout_prose.txt), and
small random tokenizers of each byte-level BPE family written by `tokenizers` itself -- a checkpoint
directory (tokenizer.json + tokenizer_config.json as the family ships them) and the GGUF metadata
llama.cpp's converter would write for it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
# Pieces random texts are made of: contractions (and the letters case-insensitive matching reaches), runs
# of whitespace, numbers of several scripts, code points the Unicode versions disagree on, special tokens.
FRAGMENTS = [
    "'s", "'S", "'t", "'RE", "'ve", "'M", "'ll", "'D", "'ſ", "'\u212a", "n't", " ", "  ", "   ", "\t", "\n", "\r",
    "\r\n", "\n\n ", " \n", "\u00a0", "\u3000", "\x85", "\u2028", "\u2029", "\x1c", "\x0b", "123", "4567", " 89",
    "x2", "1,234", "١٢٣", "½", "²", "Ⅻ", "①", "𝟘", "\U00011de7", "\U00016ff4", "abc", "ÀÉ", "ǅ", "ſ", "日本",
    "😀", "👍🏽", "e\u0301", "\u0301", "!!", " ...", "$+<=>^~|`", "«»", "—", "\u1b4f", "(hello)", "\tfoo", ".bar",
    "<|im_end|>", "\U0001e030", "\u1c89", "\U00010d40",
]


def corpus() -> list[str]:
    """The Unicode corpus and the prose paragraphs, each text once."""
    texts = json.loads((DATA / "tokenizer_corpus.json").read_text(encoding="utf-8"))
    prose = (DATA / "heldout_prose.txt").read_text(encoding="utf-8")
    return texts + [p for p in prose.split("\n\n") if p.strip()] + [prose]


@dataclass(frozen=True)
class Family:
    """How one family's tokenizer.json and tokenizer_config.json look (pre-tokenizer, normalizer,
    post-processor, special and plain added tokens, named tokens) and its GGUF `tokenizer.ggml.pre`."""

    name: str
    gguf_pre: str
    pre_tokenizer: dict[str, Any]
    special: tuple[str, ...]
    named: dict[str, str | None]
    plain_added: tuple[str, ...] = ()
    normalizer: dict[str, Any] | None = None
    bos_template: bool = False  # a TemplateProcessing that puts the BOS first (Llama 3)
    ignore_merges: bool = False
    extra_config: dict[str, Any] = field(default_factory=dict)


def _byte_level(use_regex: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _split(pattern: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def families() -> dict[str, Family]:
    from webtensor.text.pretok import LLAMA3_PATTERN, QWEN2_PATTERN

    chatml = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    return {f.name: f for f in [
        Family("gpt2", "gpt-2", _byte_level(True), ("<|endoftext|>",),
               {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}),
        Family("llama3", "llama-bpe",
               {"type": "Sequence", "pretokenizers": [_split(LLAMA3_PATTERN), _byte_level(False)]},
               ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
               {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, bos_template=True,
               ignore_merges=True),
        Family("qwen2", "qwen2",
               {"type": "Sequence", "pretokenizers": [_split(QWEN2_PATTERN), _byte_level(False)]}, chatml,
               {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
               plain_added=("<think>", "</think>", "<tool_call>"), normalizer={"type": "NFC"}),
        Family("smollm", "smollm",
               {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                      _byte_level(True)]}, chatml,
               {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>"}),
    ]}


def write_family_tokenizer(root: Path, fam: Family, vocab_size: int = 1200) -> Path:
    """A directory holding a tokenizer of family `fam` trained on the corpus by `tokenizers`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    data: dict[str, Any] = json.loads(tok.to_str())
    data["pre_tokenizer"] = fam.pre_tokenizer
    data["normalizer"] = fam.normalizer
    tok = Tokenizer.from_str(json.dumps(data))
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(fam.special), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus() * 2, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in fam.plain_added])
    data = json.loads(tok.to_str())
    data["model"]["ignore_merges"] = fam.ignore_merges
    post: dict[str, Any] = _byte_level(True)
    if fam.bos_template:
        bos = fam.named["bos_token"]
        bos_id = tok.token_to_id(bos)
        a = {"Sequence": {"id": "A", "type_id": 0}}
        post = {"type": "Sequence", "processors": [
            {**_byte_level(True), "trim_offsets": False},
            {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, a],
             "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, a,
                      {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}]}
    data["post_processor"] = post
    d = root / fam.name
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "model_max_length": 8192, **fam.named, **fam.extra_config}
    (d / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return d


def gguf_tokenizer_metadata(d: Path, fam: Family) -> dict[str, Any]:
    """The `tokenizer.ggml.*` metadata llama.cpp's converter writes for the tokenizer in `d`: the
    vocabulary in id order, token types (control for special added tokens, user-defined for plain
    ones), merges, the named ids and add_bos_token (true where the post-processor puts a BOS)."""
    data = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = dict(data["model"]["vocab"])
    types = {}
    for t in data["added_tokens"]:
        vocab[t["content"]] = t["id"]
        types[t["id"]] = 3 if t["special"] else 4
    tokens = [""] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": fam.gguf_pre, "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [types.get(i, 1) for i in range(len(tokens))],
        "tokenizer.ggml.merges": merges, "tokenizer.ggml.add_bos_token": fam.bos_template,
    }
    keys = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
            "pad_token": "padding_token_id"}
    for name, key in keys.items():
        if fam.named.get(name):
            meta[f"tokenizer.ggml.{key}"] = vocab[fam.named[name]]
    return meta


_PYODIDE_JS = """
import { loadPyodide } from "%(pyodide)s/pyodide.mjs";
const py = await loadPyodide({ indexURL: "%(pyodide)s/" });
for (const [at, root] of %(mounts)s) { py.FS.mkdirTree(at); py.FS.mount(py.FS.filesystems.NODEFS, { root }, at); }
py.runPython(%(code)s);
"""


def run_in_pyodide(code: str, mounts: dict[str, Path], workdir: Path) -> None:
    """Run Python `code` in Pyodide under node (the page's Python: 3.14, Unicode 16, no C extensions),
    with host folders mounted (guest path -> host folder; not /lib, which holds Pyodide's own). Skips
    the test where node or the Pyodide npm package is missing; fails it with Python's traceback."""
    import shutil
    import subprocess

    import pytest

    from webtensor.web.server import find_pyodide

    node = shutil.which("node")
    try:
        pyodide = find_pyodide()
    except Exception as e:  # noqa: BLE001 - SetupError: Pyodide is not installed here
        pytest.skip(str(e))
    if node is None or not (pyodide / "pyodide.mjs").is_file():
        pytest.skip("node or pyodide.mjs missing")
    script = workdir / "run.mjs"
    script.write_text(_PYODIDE_JS % {"pyodide": pyodide, "code": json.dumps(code),
                                     "mounts": json.dumps([[k, str(v)] for k, v in mounts.items()])},
                      encoding="utf-8")
    run = subprocess.run([node, str(script)], capture_output=True, text=True, timeout=600)
    tail = run.stderr[run.stderr.find("PythonError"):] if "PythonError" in run.stderr else run.stderr[-3000:]
    assert run.returncode == 0, tail[:3000]
