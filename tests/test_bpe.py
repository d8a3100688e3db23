"""Tests for the pure-Python byte-level BPE tokenizer against Hugging Face ``tokenizers``."""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import AddedToken as HFAddedToken  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

try:
    from webtensor.text import bpe, pretok
except ImportError:  # package not installed: import from the src/ tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from webtensor.text import bpe, pretok

ByteLevelBPE = bpe.ByteLevelBPE
TokenizerFormatError = bpe.TokenizerFormatError

EOT = "<|endoftext|>"

TRAIN_CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's the dog's bone, isn't it?",
    "They're sure we've done what I'm told; you'll see, he'd agree. Don't stop!",
    "In 1984, 42 people paid $3.50 each (about 147 dollars) on 2024-05-17 at 10:30pm.",
    "Naïve café résumé façade jalapeño Ångström Zürich crème brûlée São Paulo.",
    "Привет, как дела? Это тест токенизатора. Москва 2024.",
    "Καλημέρα κόσμε, αυτό είναι ένα τεστ. Αθήνα.",
    "مرحبا بالعالم، هذا اختبار. ١٢٣٤٥",
    "日本語のテキストです。東京は大きい都市です。中文测试，你好世界！한국어 텍스트",
    "def main():\n    print('hello world')\n    return 0\n\n\nif x == 1:\n\tpass\n",
    "Emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨ and more!!! ??? ... --- ***",
    '<html><body class="main">Hello &amp; goodbye</body></html> {"key": [1, 2, 3]}',
    "e\u0301 a\u0308 n\u0303 combining marks; ﬁ ligature; ½ ² ⅷ Ⅻ ① numbers",
    "    indented    text   with   many    spaces   \n\n  \n  trailing   ",
] * 4


def _train(tmp: Path, *, add_prefix_space: bool = False) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAIN_CORPUS, trainer)
    return tok


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, Path]:
    """A trained HF tokenizer saved as tokenizer.json and as vocab.json + merges.txt."""
    d = tmp_path_factory.mktemp("bpe")
    tok = _train(d)
    tok.save(str(d / "tokenizer.json"))
    files_dir = d / "files"
    files_dir.mkdir()
    tok.model.save(str(files_dir))
    return tok, d


@pytest.fixture(scope="module")
def hf(trained: tuple[Tokenizer, Path]) -> Tokenizer:
    return trained[0]


@pytest.fixture(scope="module")
def mine(trained: tuple[Tokenizer, Path]) -> ByteLevelBPE:
    return ByteLevelBPE.from_tokenizer_json(trained[1] / "tokenizer.json")


@pytest.fixture(scope="module")
def all_loaders(trained: tuple[Tokenizer, Path]) -> dict[str, ByteLevelBPE]:
    d = trained[1]
    data = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    merges = data["model"]["merges"]
    # The other merges spelling: "a b" strings if the file has pairs, and vice versa.
    if merges and isinstance(merges[0], list):
        data["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    else:
        data["model"]["merges"] = [m.split(" ") for m in merges]
    alt = d / "alt"
    alt.mkdir(exist_ok=True)
    (alt / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    return {
        "tokenizer.json": ByteLevelBPE.from_tokenizer_json(d / "tokenizer.json"),
        "tokenizer.json(alt merges)": ByteLevelBPE.from_dir(alt),
        "vocab+merges": ByteLevelBPE.from_files(d / "files" / "vocab.json", d / "files" / "merges.txt"),
        "from_dir(vocab+merges)": ByteLevelBPE.from_dir(d / "files"),
    }


CASES = [
    "",
    " ",
    "a",
    "Hello world",
    "Hello, world! How are you today?",
    # contractions (GPT-2 only knows the lowercase ones)
    "it's isn't they're we've I'm you'll he'd",
    "IT'S ISN'T THEY'RE WE'VE I'M YOU'LL HE'D 'S 'T 'Re",
    "'s's 't 'tis ''s  's 'll'd 'x rock'n'roll",
    "dog's ‘curly’ quotes’s ʼs",
    # whitespace
    "a  b   c    d",
    "tab\tseparated\t\tvalues\t",
    "line1\nline2\r\nline3\n\n\nline4",
    "trailing spaces   ",
    "   leading spaces",
    "\n\n  \n",
    " \t \n \x0b \x0c \r ",
    "nbsp\u00a0here\u00a0\u00a0twice \u2003em\u3000ideographic\u2028ls\u2029ps\x85nel",
    "\x1c\x1d\x1e\x1f ascii separators are not whitespace here",
    "   \t\t  x",
    # numbers and digits mixed with letters
    "123 4567 89012345 abc123def 3.14159 1e-10 0x1F 2nd 21st",
    "١٢٣ ٤٥٦ ۱۲۳ ०१२ ½ ¾ ² ³ Ⅻ ⅷ ① ⑩ 〇 一二三",
    # punctuation runs
    "!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((())) [[]] {{}} <<>> ~~~ ``` ''' \"\"\"",
    "a.b,c;d:e!f?g-h_i/j\\k|l",
    "---->>>  <<<----  ==> <=> !== === // /* */ #!/usr/bin/env",
    # unicode
    "naïve café résumé Ångström façade jalapeño",
    "e\u0301 a\u0308\u0301 \u0301\u0301 n\u0303 ◌̰ combining",
    "Привет, мир! Это тест.",
    "Γειά σου Κόσμε ΑΒΓ αβγ",
    "مرحبا بالعالم ١٢٣",
    "שלום עולם",
    "日本語のテキスト。東京タワー！ 中文，你好。한국어",
    "हिन्दी भाषा தமிழ் ไทย ภาษา",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 𐍈 𓀀 \U0001f600",
    "\ufeffBOM \u200bzero\u200cwidth\u200djoiner \ufffd replacement",
    "\x00\x01\x02\x7f control chars \x1b[0m",
    "\ud7ff\ue000\uf8ff private use \U000f0000",
    # emoji
    "😀 😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵🇺🇸 ❤️ ✨ 1️⃣ #️⃣",
    # special token inside text
    EOT,
    f"Hello{EOT}world",
    f"{EOT}{EOT} {EOT} x{EOT}",
    f"first document.{EOT}second document",
    "<|endoftext| <|endof text|> <endoftext|> <<|endoftext|>>",
    # code
    "def f(x):\n    return x ** 2  # square\n\nclass A:\n\tpass\n",
    '{"key": "value", "n": [1, 2, 3], "nested": {"a": null}}',
    # characters unassigned in Unicode 14 but letters/numbers in tokenizers' Unicode
    "\U0002ebf0\U0002ebf1 \U00031350x \U000105c0 \U00010d40\U00010d41 \U0001e4f0 7\U00016130",
    "long" * 100,
    "a" * 300 + " " + "ab" * 200,
    " ".join(["word"] * 200),
]


def test_bytes_to_unicode_matches_tokenizers() -> None:
    table = bpe.bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("a")] == "a"
    assert sorted(table.values()) == sorted(pre_tokenizers.ByteLevel.alphabet())


@pytest.mark.parametrize("text", CASES)
def test_pretokenize_matches_tokenizers(text: str) -> None:
    ref = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    expected = [piece for piece, _ in ref.pre_tokenize_str(text)]
    assert [bpe._to_byte_level(w) for w in bpe.pretokenize(text)] == expected


def _codepoint_sample() -> list[str]:
    cps = set(range(0x3400))  # dense: Latin, Greek, Cyrillic, Indic, ..., symbols
    cps.update(range(0x3400, 0x110000, 97))
    for lo, hi, _ in pretok._PATCH:
        cps.update(range(lo, hi + 1))
    return [chr(c) for c in sorted(cps) if not 0xD800 <= c < 0xE000]


@pytest.mark.parametrize("prefix", ["a", "1", "!", "\t", " ", "'", "  "])
def test_pretokenize_character_classes(prefix: str) -> None:
    """Each code point after a letter/number/punct/space splits exactly like tokenizers."""
    text = "".join(prefix + c for c in _codepoint_sample())
    ref = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    expected = [piece for piece, _ in ref.pre_tokenize_str(text)]
    got = [bpe._to_byte_level(w) for w in bpe.pretokenize(text)]
    assert got == expected


def test_pretokenize_edge_cases() -> None:
    P = bpe.pretokenize
    assert P("") == []
    assert P("a   b") == ["a", "  ", " b"]
    assert P("a   ") == ["a", "   "]
    assert P("\t\tb") == ["\t", "\t", "b"]
    assert P("He's") == ["He", "'s"]
    assert P("HE'S") == ["HE", "'", "S"]  # uppercase is not a contraction
    assert P("''s") == ["''", "s"]
    assert P("x1y") == ["x", "1", "y"]
    assert P("Ⅻ一") == ["Ⅻ", "一"]  # Nl is \p{N}; CJK numerals are \p{L}
    assert P("\x1c\x1c") == ["\x1c\x1c"]  # not \s although str.isspace() says so
    assert P("\u00a0x") == ["\u00a0", "x"]  # only U+0020 is the optional prefix space


@pytest.mark.parametrize("text", CASES)
def test_encode_matches_tokenizers(text: str, hf: Tokenizer, all_loaders: dict[str, ByteLevelBPE]) -> None:
    expected = hf.encode(text).ids
    for name, tok in all_loaders.items():
        assert tok.encode(text) == expected, name
    tok = all_loaders["tokenizer.json"]
    assert tok.decode(expected) == hf.decode(expected, skip_special_tokens=False)
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(expected, skip_special_tokens=True) == hf.decode(expected, skip_special_tokens=True)


def test_vocab_properties(hf: Tokenizer, all_loaders: dict[str, ByteLevelBPE]) -> None:
    for name, tok in all_loaders.items():
        assert tok.vocab_size == hf.get_vocab_size() == 800, name
        assert tok.eos_token_id == hf.token_to_id(EOT) == 0, name
        assert tok.token_to_id(EOT) == 0
        assert tok.token_to_id("Ġ") == hf.token_to_id("Ġ")
        assert tok.token_to_id("no such token") is None
        assert tok.id_to_token(0) == EOT
        assert tok.is_special(0) and not tok.is_special(1)
    assert len(all_loaders["tokenizer.json"]) == 800


def test_decode_bytes_streaming(mine: ByteLevelBPE) -> None:
    text = "日本語 😀 ok"
    ids = mine.encode(text)
    raw = mine.decode_bytes(ids)
    assert raw == text.encode("utf-8")
    # Every prefix is a prefix of the UTF-8 bytes, possibly ending mid-character.
    for k in range(len(ids) + 1):
        assert raw.startswith(mine.decode_bytes(ids[:k]))
    # A lone continuation byte decodes to U+FFFD, like tokenizers.
    lone = mine.token_to_id(bpe.bytes_to_unicode()[0x98])
    assert lone is not None
    assert mine.decode_bytes([lone]) == b"\x98"
    assert mine.decode([lone]) == "\ufffd"
    assert mine.decode([mine.eos_token_id], skip_special_tokens=True) == ""
    assert mine.decode_bytes([mine.eos_token_id]) == EOT.encode()


def test_decode_rejects_unknown_ids(mine: ByteLevelBPE) -> None:
    with pytest.raises(ValueError, match="token id 100000 is not in the vocabulary"):
        mine.decode([1, 100000])
    with pytest.raises(ValueError, match="token id -1"):
        mine.decode_bytes([-1])


def test_encode_rejects_non_str(mine: ByteLevelBPE) -> None:
    with pytest.raises(TypeError, match="expects str"):
        mine.encode(b"bytes")  # type: ignore[arg-type]


def test_encode_rejects_lone_surrogates(mine: ByteLevelBPE) -> None:
    # Not valid Unicode (tokenizers cannot even receive such a string); a ValueError subclass.
    with pytest.raises(UnicodeEncodeError, match="surrogates not allowed"):
        mine.encode("a\ud800b")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=60))
def test_encode_random_text(text: str, hf: Tokenizer, mine: ByteLevelBPE) -> None:
    expected = hf.encode(text).ids
    assert mine.encode(text) == expected
    assert mine.decode(expected) == text


_WORDS = st.sampled_from(
    [
        "the",
        " the",
        "'s",
        "'S",
        " ",
        "  ",
        "\n",
        "\t",
        "1",
        "23",
        "é",
        "日本",
        "😀",
        "‍",
        EOT,
        "<|",
        "|>",
        "!",
        "...",
        "Привет",
        "\u00a0",
        "\x1c",
        "\u0301",
    ]
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.one_of(_WORDS, st.text(max_size=5)), max_size=20))
def test_encode_random_mixtures(parts: list[str], hf: Tokenizer, mine: ByteLevelBPE) -> None:
    text = "".join(parts)
    expected = hf.encode(text).ids
    assert mine.encode(text) == expected
    assert mine.decode(expected) == text


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(min_value=0, max_value=799), max_size=30))
def test_decode_random_ids(ids: list[int], hf: Tokenizer, mine: ByteLevelBPE) -> None:
    """Arbitrary id sequences (often invalid UTF-8) decode exactly like tokenizers."""
    assert mine.decode(ids) == hf.decode(ids, skip_special_tokens=False)
    assert mine.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


def test_added_token_options(tmp_path: Path) -> None:
    """lstrip / rstrip / single_word / normalized added tokens behave like tokenizers."""
    tok = _train(tmp_path)
    tok.add_special_tokens([HFAddedToken("<mask>", lstrip=True, rstrip=True)])
    tok.add_tokens([HFAddedToken("foo", single_word=True), HFAddedToken("ba")])
    tok.add_tokens([HFAddedToken("<mask>x", normalized=True)])
    tok.save(str(tmp_path / "tokenizer.json"))
    mine = ByteLevelBPE.from_tokenizer_json(tmp_path / "tokenizer.json")
    texts = [
        "I saw a <mask> there",
        "a\t <mask>\u2003\nb",
        "<mask><mask>  <mask>",
        "foo food afoo foo. (foo) foo_bar é foo",
        "bar bazaar ba",
        "<mask>x <mask>xx",
        f"{EOT}<mask>{EOT}",
    ]
    for text in texts:
        assert mine.encode(text) == tok.encode(text).ids, text
        ids = tok.encode(text).ids
        assert mine.decode(ids) == tok.decode(ids, skip_special_tokens=False)
    assert mine.vocab_size == tok.get_vocab_size()


def test_add_prefix_space(tmp_path: Path) -> None:
    tok = _train(tmp_path, add_prefix_space=True)
    tok.save(str(tmp_path / "tokenizer.json"))
    mine = ByteLevelBPE.from_tokenizer_json(tmp_path / "tokenizer.json")
    assert mine.add_prefix_space
    for text in ["", "Hello world", " Hello", f"a{EOT}b", f"{EOT} x", "\nline"]:
        assert mine.encode(text) == tok.encode(text).ids, text


def test_bpe_merge_order_matches_priority_queue() -> None:
    """Hand-made merges where the naive and the priority-queue algorithm could differ."""
    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "aa": 6, "aaa": 7}
    merges = [("b", "c"), ("a", "b"), ("a", "bc"), ("a", "a"), ("aa", "a")]
    mine = ByteLevelBPE(vocab, merges)
    ref = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    for word in ["abc", "aaaa", "aaaaa", "abcabc", "ababc", "cab", "aaabca"]:
        assert mine.encode(word) == ref.encode(word).ids, word


def test_missing_characters_are_dropped_or_unk() -> None:
    vocab = {"a": 0, "b": 1, "<unk>": 2}
    plain = ByteLevelBPE(vocab, [])
    assert plain.encode("axxb") == [0, 1]
    unk = ByteLevelBPE(vocab, [], unk_token="<unk>")
    assert unk.encode("axxb") == [0, 2, 2, 1]
    fused = ByteLevelBPE(vocab, [], unk_token="<unk>", fuse_unk=True)
    assert fused.encode("axxb") == [0, 2, 1]


# --- loading errors --------------------------------------------------------------------------


def _write_tokenizer_json(tmp_path: Path, trained_dir: Path, mutate) -> Path:
    data = json.loads((trained_dir / "tokenizer.json").read_text(encoding="utf-8"))
    mutate(data)
    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps(data), encoding="utf-8")
    return p


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(normalizer={"type": "Replace"}), "normalizer 'Replace' is not supported"),
        (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer 'Whitespace'"),
        (lambda d: d["model"].update(type="WordPiece"), "model type 'WordPiece'"),
        (lambda d: d["model"].update(dropout=0.1), "dropout"),
        (lambda d: d["model"].update(continuing_subword_prefix="##"), "continuing_subword_prefix"),
        (lambda d: d["model"].update(byte_fallback=True), "byte_fallback"),
        (lambda d: d["model"]["merges"].append(["Ġ", "zzzz"]), "token 'zzzz' is not in the vocabulary"),
        (lambda d: d["model"]["merges"].append("a b c"), "exactly two string parts"),
        (lambda d: d["model"]["vocab"].update(dup=5), "model.vocab: id 5 is used by both"),
        (lambda d: d.pop("model"), "missing 'model'"),
        (lambda d: d["added_tokens"][0].update(id=7), "added_tokens: '<|endoftext|>' has id 7"),
        (lambda d: d.update(post_processor={"type": "TemplateProcessing"}), "post_processor"),
    ],
)
def test_tokenizer_json_errors(tmp_path: Path, trained: tuple[Tokenizer, Path], mutate, message: str) -> None:
    p = _write_tokenizer_json(tmp_path, trained[1], mutate)
    with pytest.raises(TokenizerFormatError, match=message):
        ByteLevelBPE.from_tokenizer_json(p)


def test_merge_result_not_in_vocab() -> None:
    with pytest.raises(TokenizerFormatError, match="result 'ab' is not in the vocabulary"):
        ByteLevelBPE({"a": 0, "b": 1}, [("a", "b")])


def test_file_errors(tmp_path: Path, trained: tuple[Tokenizer, Path]) -> None:
    with pytest.raises(FileNotFoundError, match="neither tokenizer.json nor vocab.json"):
        ByteLevelBPE.from_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        ByteLevelBPE.from_dir(tmp_path / "missing")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerFormatError, match="invalid JSON"):
        ByteLevelBPE.from_tokenizer_json(bad)
    merges = tmp_path / "merges.txt"
    merges.write_text("#version: 0.2\nĠ t\nonlyone\n", encoding="utf-8")
    with pytest.raises(TokenizerFormatError, match=r"merges.txt:3: expected 'left right'"):
        ByteLevelBPE.from_files(trained[1] / "files" / "vocab.json", merges)
    assert issubclass(TokenizerFormatError, ValueError)


def test_from_files_special_tokens(tmp_path: Path) -> None:
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2}), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n", encoding="utf-8")
    tok = ByteLevelBPE.from_dir(tmp_path)
    assert tok.eos_token_id is None and tok.vocab_size == 3  # no <|endoftext|> in this vocab
    assert tok.encode("abba") == [2, 1, 0]
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2, EOT: 3}), encoding="utf-8")
    tok = ByteLevelBPE.from_dir(tmp_path)
    assert tok.eos_token_id == 3 and tok.vocab_size == 4 and tok.is_special(3)
    assert tok.encode(f"ab{EOT}ba") == [2, 3, 1, 0]
    plain = ByteLevelBPE.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt", special_tokens=())
    assert plain.eos_token_id == 3 and not plain.is_special(3)  # still in the vocab, not matched
    assert plain.encode(f"ab{EOT}") != [2, 3]


def test_unicode_patch_table_is_consistent() -> None:
    """Patched code points are unassigned in this Python or already agree with it."""
    from webtensor.text import pretok

    for lo, hi, shadow in pretok._PATCH:
        for cp in (lo, hi):
            cat = unicodedata.category(chr(cp))
            want = {pretok._LETTER: "L", pretok._NUMBER: "N", pretok._PUNCT: "P", pretok._RUST_DIGIT: "N"}[shadow]
            assert cat == "Cn" or cat[0] == want, hex(cp)


_SHIPPED = Path(__file__).resolve().parents[1] / "src" / "webtensor" / "models" / "shipped"


@pytest.mark.skipif(not (_SHIPPED / "tokenizer.json").is_file(), reason="no shipped tokenizer.json")
def test_shipped_tokenizer_matches_tokenizers() -> None:
    ref = Tokenizer.from_file(str(_SHIPPED / "tokenizer.json"))
    loaders = {"tokenizer.json": ByteLevelBPE.from_tokenizer_json(_SHIPPED / "tokenizer.json")}
    if (_SHIPPED / "vocab.json").is_file() and (_SHIPPED / "merges.txt").is_file():
        loaders["vocab+merges"] = ByteLevelBPE.from_files(_SHIPPED / "vocab.json", _SHIPPED / "merges.txt")
    for name, mine in loaders.items():
        assert mine.vocab_size == ref.get_vocab_size(), name
        assert mine.eos_token_id == ref.token_to_id(EOT), name
        for text in CASES:
            ids = ref.encode(text).ids
            assert mine.encode(text) == ids, (name, text)
            assert mine.decode(ids) == ref.decode(ids, skip_special_tokens=False), (name, text)
        if mine.vocab_size == 50257:  # the real GPT-2 vocabulary
            assert mine.encode("Hello world") == [15496, 995]
            assert mine.eos_token_id == 50256
