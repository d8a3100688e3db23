"""The pure-Python pre-tokenizer steps (webtensor.text.pretok) split text exactly as `tokenizers` does:
GPT-2's, Llama 3's and Qwen2's split regexes, llama.cpp's "default" chain of four splits, Digits (single
and runs), ByteLevel -- on random text rich in what the Unicode classes and the regexes disagree on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

tokenizers = pytest.importorskip("tokenizers")
from text_fixtures import FRAGMENTS  # noqa: E402
from tokenizers import Regex, pre_tokenizers  # noqa: E402

from webtensor.text import pretok  # noqa: E402

TEXT = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)), max_size=14).map("".join)


def _split(pattern: str) -> object:
    return pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)


CASES = {
    **{name: (pre_tokenizers.Sequence([_split(p)]), (pretok.RegexSplit(p),))
       for name, p in pretok.SPLIT_PATTERNS.items()},
    "llama.cpp default": (pre_tokenizers.Sequence([_split(p) for p in pretok.DEFAULT_PATTERNS]),
                          tuple(pretok.RegexSplit(p) for p in pretok.DEFAULT_PATTERNS)),
    "Digits": (pre_tokenizers.Digits(individual_digits=True), (pretok.DigitsSplit(True),)),
    "Digits runs": (pre_tokenizers.Digits(individual_digits=False), (pretok.DigitsSplit(False),)),
    "SmolLM2": (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
                (pretok.DigitsSplit(True), pretok.ByteLevelStep())),
    "ByteLevel prefix space": (pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
                               (pretok.ByteLevelStep(add_prefix_space=True),)),
}


def _reference(pre: object, text: str) -> list[str]:
    """`tokenizers`' pieces, spelled back from GPT-2's byte alphabet where ByteLevel spelled them."""
    pieces = [p for p, _ in pre.pre_tokenize_str(text)]  # type: ignore[attr-defined]
    if "ByteLevel" not in repr(pre):
        return pieces
    from webtensor.text.bpe import byte_level_bytes

    return [byte_level_bytes(p).decode("utf-8") for p in pieces]


@settings(max_examples=1500, deadline=None)
@given(text=TEXT, name=st.sampled_from(sorted(CASES)))
def test_steps_split_as_tokenizers(text: str, name: str) -> None:
    pre, steps = CASES[name]
    assert pretok.run_steps(text, steps) == _reference(pre, text)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_fragment(name: str) -> None:
    pre, steps = CASES[name]
    for a in FRAGMENTS:
        for b in FRAGMENTS[::3]:
            assert pretok.run_steps(a + b, steps) == _reference(pre, a + b), (a, b)


@pytest.mark.parametrize(("pattern", "message"), [
    (r"\p{Lu}+", r"\\p\{Lu\} is not a class"),
    (r"[^\S]", r"the escape \\S"),
    (r"\d+", r"the escape \\d"),
    ("é+", "non-ASCII literal"),
    (r"[a[b]]", "nested character classes"),
])
def test_unknown_regex_constructs_refused(pattern: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pretok.shadow_regex(pattern)


def test_whitespace_is_oniguruma_s() -> None:
    assert all(pretok.is_whitespace(c) for c in "\t\n\x0b\x0c\r \x85\u00a0\u1680\u2000\u2028\u2029\u3000")
    assert not any(pretok.is_whitespace(c) for c in "\x1c\x1f\u200b\u180ea")
