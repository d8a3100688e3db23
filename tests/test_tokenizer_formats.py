"""Tokenizer files as current tools write them: the page's pure-Python BPE and the native path
(`tokenizers`) accept the same files, give the same ids and text, and refuse the same files with
the same message."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import ByteLevelBPETokenizer, Tokenizer  # noqa: E402

from webtensor.errors import CheckpointError, TokenizerError  # noqa: E402
from webtensor.text.bpe import ByteLevelBPE  # noqa: E402
from webtensor.text.tokenizer import GPT2Tokenizer  # noqa: E402
from webtensor.text.tokenizer_files import GPT2_SPLIT_PATTERN  # noqa: E402

EOT = "<|endoftext|>"
SHIPPED = Path(__file__).resolve().parents[1] / "src" / "webtensor" / "models" / "shipped"

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's the dog's bone, isn't it? THE END.",
    "They're sure we've done what I'm told; you'll see, he'd agree. DON'T STOP!",
    "In 1984, 42 people paid $3.50 each on 2024-05-17 at 10:30pm. ½ ² ① Ⅻ ﬁ ＡＢＣ",
    "Naïve café résumé Ångström Zürich crème brûlée. Привет мир. Σίσυφος ΟΔΟΣ. 日本語 中文",
    "def main():\n    print('hello world')\n\n\n\tpass  \n",
    "Emoji 😀 👍🏽 🇫🇷 e\u0301 a\u0308 ... --- *** İstanbul",
] * 3

# Pieces hypothesis mixes into the text: contractions, whitespace runs, digits, special tokens,
# case, compatibility characters and code points the two Unicode databases disagree on.
FRAGMENTS = [
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "n't", "I'M", " ", "  ", "   ", "\t", "\n",
    "\n\n", " \n ", "\r\n", "\u00a0", "\u3000", "\x85", "123", "4567", " 89", "3.14", "x2", EOT,
    "<mask>", " <mask> ", "foo", " foo ", "afoo", "HeLLo", " World", "ÀÉÎ", "Σ", "ΟΔΟΣ", "İ", "ﬁ",
    "Ａ", "①", "½", "e\u0301", "\u0301\u0316", "\u32ff", "\ua7f2", "\u1ac1", "\U0001e030", "\u0340",
    "\U00010d50", "\u1c89", "😀", "👍🏽", "\ufffd",
]
# characters this Python's Unicode database knows (Cn: unassigned): `tokenizers`' Rust tables are newer, so a
# character assigned since (U+1E030, Unicode 15; Python 3.11 has 14) is a letter to one and not the other, and
# an added token with single_word matches next to it in one only (the thorough profile found it)
CHARS = st.characters(exclude_categories=("Cs", "Cn"))
TEXT = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(CHARS, max_size=6)), max_size=12).map("".join)


def _save(d: Path, data: dict[str, Any]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return d


def _byte_level(add_prefix_space: bool = False, use_regex: bool = True) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True, "use_regex": use_regex}


_SPLIT = {"type": "Split", "pattern": {"Regex": GPT2_SPLIT_PATTERN}, "behavior": "Isolated", "invert": False}
_A = {"Sequence": {"id": "A", "type_id": 0}}


def _template(first_id: int) -> dict[str, Any]:
    """A TemplateProcessing that puts <|endoftext|> before the text (a BOS)."""
    return {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": EOT, "type_id": 0}}, _A],
            "pair": [_A, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {EOT: {"id": EOT, "ids": [first_id], "tokens": [EOT]}}}


def _added(content: str, id_: int, **flags: bool) -> dict[str, Any]:
    base = dict(single_word=False, lstrip=False, rstrip=False, normalized=False, special=False)
    return {"id": id_, "content": content, **base, **flags}


def _variants(base: dict[str, Any]) -> dict[str, Callable[[dict[str, Any]], None]]:
    """Hand edits of a tokenizer.json, each a variant `tokenizers` reads."""
    n = max(base["model"]["vocab"].values()) + 1

    def added(d: dict[str, Any]) -> None:
        d["added_tokens"] += [_added("<mask>", n, lstrip=True, rstrip=True, special=True),
                              _added("foo", n + 1, single_word=True), _added("HeLLo", n + 2, normalized=True)]

    def normalizer(spec: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
        return lambda d: (d.update(normalizer=spec), added(d))

    return {
        "as saved": lambda d: None,
        "post null": lambda d: d.update(post_processor=None),
        "post template": lambda d: d.update(post_processor={**_template(0), "single": [_A], "special_tokens": {}}),
        "post bos": lambda d: d.update(post_processor={"type": "Sequence", "processors": [
            {**_byte_level(True), "trim_offsets": False}, _template(0)]}),
        "prefix space": lambda d: d.update(pre_tokenizer=_byte_level(add_prefix_space=True)),
        "split + bytelevel": lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            _SPLIT, _byte_level(use_regex=False)]}),
        "split + prefix + regex": lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            _SPLIT, _byte_level(add_prefix_space=True)]}),
        "no regex": lambda d: d.update(pre_tokenizer=_byte_level(use_regex=False)),
        "merge strings": lambda d: d["model"].update(merges=[" ".join(m) for m in d["model"]["merges"]]),
        "ignore_merges": lambda d: d["model"].update(ignore_merges=True),
        "empty prefix/suffix": lambda d: d["model"].update(continuing_subword_prefix="", end_of_word_suffix=""),
        "added tokens": added,
        "NFC": normalizer({"type": "NFC"}),
        "NFD": normalizer({"type": "NFD"}),
        "NFKC": normalizer({"type": "NFKC"}),
        "NFKD": normalizer({"type": "NFKD"}),
        "Lowercase": normalizer({"type": "Lowercase"}),
        "NFKC+Lowercase": normalizer({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}),
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tokenizer directories written by current tools and hand-edited variants of them."""
    root = tmp_path_factory.mktemp("tokfmt")
    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(CORPUS, vocab_size=600, min_frequency=1, special_tokens=[EOT], show_progress=False)
    trained.save(str(root / "bl.json"))
    dirs = {"vocab+merges": root / "files"}
    dirs["vocab+merges"].mkdir()
    trained.save_model(str(dirs["vocab+merges"]))
    merges = (dirs["vocab+merges"] / "merges.txt").read_text(encoding="utf-8")
    assert merges.startswith("#version")
    headless = root / "files-headless"
    headless.mkdir()
    (headless / "vocab.json").write_bytes((dirs["vocab+merges"] / "vocab.json").read_bytes())
    (headless / "merges.txt").write_text(merges.split("\n", 1)[1], encoding="utf-8")
    dirs["vocab+merges, no #version"] = headless

    try:  # the files transformers writes (the parity tier; the core tier runs without transformers)
        from transformers import GPT2TokenizerFast
    except ImportError:
        GPT2TokenizerFast = None
    if GPT2TokenizerFast is not None:
        fast = GPT2TokenizerFast.from_pretrained(str(dirs["vocab+merges"]))
        for legacy in (False, True):
            fast.save_pretrained(str(root / f"transformers-{legacy}"), legacy_format=legacy)
            dirs[f"transformers legacy_format={legacy}"] = root / f"transformers-{legacy}"

    base = json.loads((root / "bl.json").read_text(encoding="utf-8"))
    for name, edit in _variants(base).items():
        data = copy.deepcopy(base)
        edit(data)
        dirs[name] = _save(root / name.replace(" ", "_").replace("/", "_"), data)
    if (SHIPPED / "tokenizer.json").is_file():
        dirs["shipped"] = SHIPPED
    return dirs


@pytest.fixture(scope="module")
def loaded(checkpoints: dict[str, Path]) -> dict[str, tuple[GPT2Tokenizer, GPT2Tokenizer]]:
    """name -> (page tokenizer, native tokenizer), both through GPT2Tokenizer.from_dir."""
    return {name: (GPT2Tokenizer.from_dir(d, native=False), GPT2Tokenizer.from_dir(d, native=True))
            for name, d in checkpoints.items()}


@pytest.mark.hf
def test_current_transformers_file_is_accepted(checkpoints: dict[str, Path]) -> None:
    """The class-4 example: a TemplateProcessing post-processor with no special tokens."""
    pytest.importorskip("transformers")
    data = json.loads((checkpoints["transformers legacy_format=False"] / "tokenizer.json").read_text("utf-8"))
    assert data["post_processor"]["type"] == "TemplateProcessing"
    assert GPT2Tokenizer.from_dir(checkpoints["transformers legacy_format=False"], native=False).kind == "pure-python"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), text=TEXT)
def test_encode_decode_match_tokenizers(data: st.DataObject, text: str, checkpoints: dict[str, Path],
                                        loaded: dict[str, tuple[GPT2Tokenizer, GPT2Tokenizer]]) -> None:
    name = data.draw(st.sampled_from(sorted(loaded)), label="checkpoint")
    page, native = loaded[name]
    assert page.kind == "pure-python" and native.kind == "tokenizers"
    hf = native._tok
    ids = hf.encode(text, add_special_tokens=False).ids
    assert page.encode(text) == ids
    assert native.encode(text) == ids
    # the post-processor's template (add_special_tokens=True) too
    assert page._tok.encode(text, add_special_tokens=True) == hf.encode(text).ids
    for skip in (False, True):
        assert page.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
        assert native.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert "".join(page.stream_decode(ids)) == page.decode(ids)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_decode_random_ids_matches_tokenizers(data: st.DataObject,
                                              loaded: dict[str, tuple[GPT2Tokenizer, GPT2Tokenizer]]) -> None:
    """Any id sequence (often invalid UTF-8 -> U+FFFD) decodes as `tokenizers` decodes it."""
    name = data.draw(st.sampled_from(sorted(loaded)), label="checkpoint")
    page, native = loaded[name]
    ids = data.draw(st.lists(st.integers(0, page.vocab_size - 1), max_size=20), label="ids")
    for skip in (False, True):
        expected = native._tok.decode(ids, skip_special_tokens=skip)
        assert page.decode(ids, skip_special_tokens=skip) == expected
        assert native.decode(ids, skip_special_tokens=skip) == expected


def test_vocabulary_facts_agree(loaded: dict[str, tuple[GPT2Tokenizer, GPT2Tokenizer]]) -> None:
    for name, (page, native) in loaded.items():
        hf = native._tok
        assert page.vocab_size == native.vocab_size == hf.get_vocab_size(with_added_tokens=True), name
        assert page.eos_token_id == native.eos_token_id == hf.token_to_id(EOT), name


# --- refusals: the same message on both paths --------------------------------------------------

_A_EDIT = Callable[[dict[str, Any]], None]
REFUSED: list[tuple[str, _A_EDIT, str]] = [
    ("normalizer", lambda d: d.update(normalizer={"type": "Replace", "pattern": {"String": "a"}, "content": "b"}),
     "normalizer 'Replace' is not supported"),
    ("normalizer in Sequence", lambda d: d.update(normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFC"}, {"type": "Strip", "strip_left": True, "strip_right": True}]}),
     r"normalizer.normalizers\[1\] 'Strip'"),
    ("pre_tokenizer", lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer 'Whitespace'"),
    ("pre_tokenizer null", lambda d: d.update(pre_tokenizer=None), "pre_tokenizer is null"),
    ("split regex", lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {**_SPLIT, "pattern": {"Regex": r"\s+"}}, _byte_level(use_regex=False)]}),
     r"pre_tokenizer.pretokenizers\[0\].pattern"),
    ("split behavior", lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {**_SPLIT, "behavior": "Removed"}, _byte_level(use_regex=False)]}), "behavior 'Removed'"),
    ("bytelevel not last", lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        _byte_level(), _SPLIT]}), "ByteLevel must come last"),
    ("bytelevel flag", lambda d: d["pre_tokenizer"].update(add_prefix_space="yes"),
     "pre_tokenizer.add_prefix_space must be true or false"),
    ("bytelevel missing flag", lambda d: d["pre_tokenizer"].pop("trim_offsets"),
     "pre_tokenizer.trim_offsets is missing"),
    ("post_processor", lambda d: d.update(post_processor={"type": "RobertaProcessing", "sep": ["</s>", 2],
                                                          "cls": ["<s>", 0]}), "post_processor 'RobertaProcessing'"),
    ("template twice A", lambda d: d.update(post_processor={**_template(0), "single": [_A, _A]}),
     r"post_processor.single\[1\]"),
    ("template unknown token", lambda d: d.update(post_processor={
        **_template(0), "special_tokens": {}}), "special token '<|endoftext|>' has no 'ids'"),
    ("template id", lambda d: d.update(post_processor={"type": "Sequence", "processors": [_template(99999)]}),
     "post_processor: special token id 99999"),
    ("decoder", lambda d: d.update(decoder={"type": "WordPiece", "prefix": "##", "cleanup": True}),
     "decoder 'WordPiece'"),
    ("decoder null", lambda d: d.update(decoder=None), "decoder is null"),
    ("truncation", lambda d: d.update(truncation={"direction": "Right", "max_length": 8, "strategy": "LongestFirst",
                                                  "stride": 0}), "truncation is not supported"),
    ("padding", lambda d: d.update(padding={"strategy": "BatchLongest"}), "padding is not supported"),
    ("model type", lambda d: d["model"].update(type="WordPiece"), "model type 'WordPiece'"),
    ("dropout", lambda d: d["model"].update(dropout=0.1), "model.dropout = 0.1"),
    ("prefix", lambda d: d["model"].update(continuing_subword_prefix="##"), "model.continuing_subword_prefix"),
    ("suffix", lambda d: d["model"].update(end_of_word_suffix="</w>"), "model.end_of_word_suffix"),
    ("byte_fallback", lambda d: d["model"].update(byte_fallback=True), "model.byte_fallback"),
    ("unknown field", lambda d: d["model"].update(sentencepiece=True), "model.sentencepiece is not a field"),
    ("merge part", lambda d: d["model"]["merges"].append(["Ġ", "zzzz"]), "token 'zzzz' is not in the vocabulary"),
    ("merge shape", lambda d: d["model"]["merges"].append("a b c"), "exactly two string parts"),
    ("duplicate id", lambda d: d["model"]["vocab"].update(dup=5), "model.vocab: id 5 is used by both"),
    ("added id", lambda d: d["added_tokens"][0].update(id=7), "added_tokens: '<|endoftext|>' has id 7"),
    ("added flag", lambda d: d["added_tokens"][0].pop("lstrip"), r"added_tokens\[0\].lstrip is missing"),
    ("added empty", lambda d: d["added_tokens"].append(_added("", 9999)), "has an empty 'content'"),
]


@pytest.mark.parametrize(("case", "edit", "message"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_alike_on_both_paths(tmp_path: Path, checkpoints: dict[str, Path], case: str, edit: _A_EDIT,
                                     message: str) -> None:
    data = json.loads((checkpoints["as saved"] / "tokenizer.json").read_text(encoding="utf-8"))
    edit(data)
    d = _save(tmp_path / "t", data)
    errors = []
    for native in (False, True):
        with pytest.raises(TokenizerError, match=message) as info:
            GPT2Tokenizer.from_dir(d, native=native)
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert isinstance(info.value, CheckpointError)
    with pytest.raises(TokenizerError, match=message):
        ByteLevelBPE.from_dir(d)


def test_refused_vocab_merges_alike(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    src = checkpoints["vocab+merges"]
    (tmp_path / "vocab.json").write_bytes((src / "vocab.json").read_bytes())
    (tmp_path / "merges.txt").write_text("#version: 0.2\nĠ t\nonlyone\n", encoding="utf-8")
    messages = []
    for native in (False, True):
        with pytest.raises(TokenizerError, match=r"merges.txt:3: expected 'left right'") as info:
            GPT2Tokenizer.from_dir(tmp_path, native=native)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    (tmp_path / "merges.txt").unlink()
    (tmp_path / "vocab.json").unlink()
    for native in (False, True):
        with pytest.raises(TokenizerError, match="has no tokenizer"):
            GPT2Tokenizer.from_dir(tmp_path, native=native)


def test_unknown_ids_refused_alike(loaded: dict[str, tuple[GPT2Tokenizer, GPT2Tokenizer]]) -> None:
    for tok in loaded["as saved"]:
        with pytest.raises(TokenizerError, match="not in the vocabulary"):
            tok.decode([tok.vocab_size + 5])


def test_shipped_tokenizer_is_read_by_hf_and_matches() -> None:
    if not (SHIPPED / "tokenizer.json").is_file():
        pytest.skip("no shipped tokenizer.json")
    ref = Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))
    page = GPT2Tokenizer.from_dir(SHIPPED, native=False)
    text = f"It's 2024 — naïve café!{EOT}  \n\tcode()  日本"
    assert page.encode(text) == ref.encode(text, add_special_tokens=False).ids
    # <|endoftext|> never shows as text (the CLI, ignore_eos streams) unless asked for
    ids = page.encode(text)
    assert page.decode(ids) == text.replace(EOT, "") == "".join(page.stream_decode(ids))
    assert page.decode(ids, skip_special_tokens=False) == text and page.token_bytes(page.eos_token_id) == b""


# --- the page's own Python (Pyodide, another Unicode version) -----------------------------------

_PYODIDE_CODE = """
import json, sys, unicodedata
sys.path.insert(0, "/src")
from webtensor.text.tokenizer import GPT2Tokenizer
data = json.load(open("/cases/cases.json"))
out = {"unicode": unicodedata.unidata_version, "ids": {}, "text": {}}
for name in data["names"]:
    tok = GPT2Tokenizer.from_dir("/cases/" + name)
    assert tok.kind == "pure-python", tok.kind
    out["ids"][name] = [tok.encode(t) for t in data["texts"]]
    out["text"][name] = [tok.decode(ids, skip_special_tokens=False) for ids in data["ids"][name]]
json.dump(out, open("/cases/out.json", "w"))
"""


def _page_texts(n: int, seed: int) -> list[str]:
    """Texts rich in what the Unicode versions disagree on (seeded; the inert table in full)."""
    import random

    from webtensor.text import unicode_norm

    rng = random.Random(seed)
    odd = [chr(c) for lo, hi in unicode_norm._NORM_INERT for c in range(lo, hi + 1)]
    odd += [chr(c) for c in unicode_norm._LOWER_PATCH]
    texts = ["a" + ch + "\u0334" + ch.upper() for ch in odd]
    for _ in range(n):
        parts = [rng.choice(FRAGMENTS) if rng.random() < 0.5 else rng.choice(odd) + rng.choice(["", "\u0301", "A"])
                 for _ in range(rng.randrange(1, 8))]
        parts.append("".join(chr(rng.choice([rng.randrange(0x80, 0x3000), rng.randrange(0x10000, 0x30000)]))
                             for _ in range(3)))
        texts.append("".join(parts))
    return texts


def test_page_python_matches_tokenizers(tmp_path: Path, checkpoints: dict[str, Path],
                                        loaded: dict[str, tuple[GPT2Tokenizer, GPT2Tokenizer]]) -> None:
    """The pure-Python BPE inside Pyodide (the page's Python and Unicode database) gives
    `tokenizers`' ids and text on the normalizer variants, added tokens and the shipped model."""
    import shutil

    from text_fixtures import run_in_pyodide

    names = [n for n in ("NFKC+Lowercase", "NFD", "NFKD", "added tokens", "split + prefix + regex",
                         "transformers legacy_format=False", "shipped") if n in checkpoints]
    texts = _page_texts(120, seed=11)
    cases = tmp_path / "cases"
    ids = {}
    for i, name in enumerate(names):
        shutil.copytree(checkpoints[name], cases / str(i), ignore=shutil.ignore_patterns("*.safetensors"))
        ids[str(i)] = [loaded[name][1]._tok.encode(t, add_special_tokens=False).ids for t in texts]
    (cases / "cases.json").write_text(json.dumps({"names": list(ids), "texts": texts, "ids": ids}), encoding="utf-8")
    run_in_pyodide(_PYODIDE_CODE, {"/src": Path(__file__).resolve().parents[1] / "src", "/cases": cases}, tmp_path)
    out = json.loads((cases / "out.json").read_text(encoding="utf-8"))
    for i, name in enumerate(names):
        hf = loaded[name][1]._tok
        for text, want, got in zip(texts, ids[str(i)], out["ids"][str(i)], strict=True):
            assert got == want, (name, out["unicode"], text)
        for want, got in zip(ids[str(i)], out["text"][str(i)], strict=True):
            assert got == hf.decode(want, skip_special_tokens=False), (name, want)
