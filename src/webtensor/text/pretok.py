"""Pre-tokenizer steps of byte-level BPE tokenizers, as Hugging Face ``tokenizers`` runs them, in
pure Python (standard library only: it runs in Pyodide, which has neither ``tokenizers`` nor ``regex``).

A step turns a list of pieces of text into a finer list; the BPE then merges inside each piece.
The steps the families in use need:

* :class:`RegexSplit` -- ``Split(Regex(pattern), behavior="Isolated")``: every match becomes a
  piece, and so does every gap between matches.  The patterns are those of GPT-2, Llama 3 and
  Qwen2 (:data:`SPLIT_PATTERNS`), plus the ones llama.cpp's ``default`` pre-tokenizer chains.
* :class:`DigitsSplit` -- ``Digits(individual_digits)``: numbers (Unicode ``N``) isolated, one by
  one or in runs (SmolLM's first step; llama.cpp's ``\\p{N}``).
* :class:`ByteLevelStep` -- ``ByteLevel(add_prefix_space, use_regex)``: an optional space in front
  of each piece and, with ``use_regex``, GPT-2's split.  Always last: the BPE then spells each
  piece in GPT-2's byte alphabet.

Unicode classes without ``regex``.  Python's :mod:`re` has no ``\\p{L}``.  Each piece is therefore
first translated, character by character, onto a *shadow* string of the same length: ASCII stays
itself; so do the two letters that ``(?i:'s)``-style case-insensitive matching can reach from
ASCII (U+017F LONG S, U+212A KELVIN SIGN); every other character becomes a private-use
placeholder naming its class -- letter (``L*``), number (``N*``), punctuation (``P*``), whitespace or
other.  :func:`shadow_regex` rewrites a pattern to a Python regex over that alphabet (``\\p{L}``
becomes ``[A-Za-z\\u017f\\u212a<letter>]`` and so on), and the match spans are cut out of the original
text.  Because the patterns only look at ASCII literals and at these classes, the spans are those
of the original regex.

The classes are Oniguruma's (the regex engine of ``tokenizers``): ``\\p{L}`` / ``\\p{N}`` / ``\\p{P}``
are the general categories ``L*`` / ``N*`` / ``P*`` (from :mod:`unicodedata`); ``\\s`` is
U+0009..U+000D, U+0085 and ``Zs`` / ``Zl`` / ``Zp`` (not ``str.isspace()``, which also takes
U+001C..U+001F); ``Digits`` takes Rust's ``char::is_numeric`` (``N*`` too, of Unicode 17).  Letters,
numbers and punctuation that ``tokenizers`` knows but the running Python leaves unassigned are
patched in from a small table, so the split is the same on Python 3.11 (Unicode 14) and in the
page's Pyodide (Unicode 16).
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_PATTERNS",
    "GPT2_PATTERN",
    "LLAMA3_PATTERN",
    "QWEN2_PATTERN",
    "SPLIT_PATTERNS",
    "ByteLevelStep",
    "DigitsSplit",
    "PreStep",
    "RegexSplit",
    "is_whitespace",
    "pretokenize",
    "run_steps",
    "shadow",
    "shadow_regex",
]

# The split patterns of the families webtensor reads, spelled as their tokenizer.json files
# (and transformers' GGUF reader) spell them.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLIT_PATTERNS = {"GPT-2": GPT2_PATTERN, "Llama 3": LLAMA3_PATTERN, "Qwen2": QWEN2_PATTERN}
# llama.cpp's "default" BPE pre-tokenizer (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_DEFAULT): four
# isolating splits in a row.  Its GPT-2 regex lacks the final `|\s+`, which changes nothing for an
# isolating split (the lone whitespace it would match is a gap, and gaps are pieces too).
DEFAULT_PATTERNS = (r"[\p{P}\$\+<=>\^~\|]+", GPT2_PATTERN, r"\p{N}+", r"[0-9][0-9][0-9]")

# -- the shadow alphabet -------------------------------------------------------------------------

_LETTER, _NUMBER, _PUNCT, _SPACE, _OTHER = "\ue000", "\ue001", "\ue002", "\ue003", "\ue004"
_RUST_DIGIT = "\ue005"  # a number to Rust's char::is_numeric (Digits) but not to Oniguruma's \p{N}
# Non-ASCII letters that case-insensitive ASCII literals match (ſ ~ s, K ~ k): kept literal.
_FOLDS_TO_ASCII = "\u017f\u212a"
_ASCII_SPACE = "\t\n\x0b\x0c\r "
_CLASSES = {  # class -> its members as a character-set body (inside [...])
    "L": "A-Za-z" + _FOLDS_TO_ASCII + _LETTER,
    "N": "0-9" + _NUMBER,
    "P": "".join(re.escape(chr(c)) for c in range(128) if unicodedata.category(chr(c))[0] == "P") + _PUNCT,
    "s": r"\t\n\x0b\x0c\r " + _SPACE,
}

# Letters (L), numbers (N) and punctuation (P) known to tokenizers' Oniguruma (Unicode 16.0) that
# are still unassigned (Cn) in Python 3.11's unicodedata (Unicode 14.0), and the numbers Rust's
# char::is_numeric (the Digits step; Unicode 17.0 in tokenizers 0.23) adds to them.  Only consulted
# for code points that the running Python reports as Cn.  (Generated by scanning every Cn code
# point through tokenizers' Split(\p{L} / \p{N} / \p{P}) and Digits.)
_PATCH_L = (
    "1C89-1C8A A7CB-A7CD A7DA-A7DC 105C0-105F3 10D4A-10D65 10D6F-10D85 10EC2-10EC4 1123F-11240 "
    "11380-11389 1138B 1138E 11390-113B5 113B7 113D1 113D3 11BC0-11BE0 11F02 11F04-11F10 "
    "11F12-11F33 1342F 13441-13446 13460-143FA 16100-1611D 16D40-16D6C 18CFF 1B132 1B155 "
    "1DF25-1DF2A 1E030-1E06D 1E4D0-1E4EB 1E5D0-1E5ED 1E5F0 2B739 2EBF0-2EE5D 31350-323AF"
)
_PATCH_N = (
    "10D40-10D49 116D0-116E3 11BF0-11BF9 11F50-11F59 16130-16139 16D70-16D79 1CCF0-1CCF9 "
    "1D2C0-1D2D3 1E4F0-1E4F9 1E5F1-1E5FA"
)
_PATCH_P = "1B4E-1B4F 1B7F 10D6E 113D4-113D5 113D7-113D8 11B00-11B09 11BE1 11F43-11F4F 16D6D-16D6F 1E5FF"
_PATCH_RUST_DIGIT = "11DE0-11DE9 16FF4-16FF6"


def _parse_ranges(spec: str, shadow: str) -> list[tuple[int, int, str]]:
    out = []
    for item in spec.split():
        lo, _, hi = item.partition("-")
        out.append((int(lo, 16), int(hi or lo, 16), shadow))
    return out


_PATCH = sorted(_parse_ranges(_PATCH_L, _LETTER) + _parse_ranges(_PATCH_N, _NUMBER) + _parse_ranges(_PATCH_P, _PUNCT)
                + _parse_ranges(_PATCH_RUST_DIGIT, _RUST_DIGIT))
_PATCH_STARTS = [lo for lo, _, _ in _PATCH]


def _shadow_char(cp: int) -> str:
    """The shadow of a non-ASCII code point: its class placeholder (or itself, for ſ and K)."""
    ch = chr(cp)
    if ch in _FOLDS_TO_ASCII:
        return ch
    cat = unicodedata.category(ch)
    if cat[0] == "L":
        return _LETTER
    if cat[0] == "N":
        return _NUMBER
    if cat in ("Zs", "Zl", "Zp") or cp == 0x85:
        return _SPACE
    if cat[0] == "P":
        return _PUNCT
    if cat == "Cn":
        i = bisect_right(_PATCH_STARTS, cp) - 1
        if i >= 0 and _PATCH[i][0] <= cp <= _PATCH[i][1]:
            return _PATCH[i][2]
    return _OTHER


class _ShadowTable(dict[int, str]):
    """``str.translate`` table that classifies (and memoizes) code points on first use."""

    def __missing__(self, cp: int) -> str:
        shadow = _shadow_char(cp)
        self[cp] = shadow
        return shadow


_SHADOW_TABLE = _ShadowTable({cp: chr(cp) for cp in range(128)})


def shadow(text: str) -> str:
    """The shadow of `text`: same length, ASCII kept, other characters replaced by their class."""
    return text if text.isascii() else text.translate(_SHADOW_TABLE)


def is_whitespace(ch: str) -> bool:
    """Unicode ``\\s`` as Oniguruma and Rust's regex see it (White_Space)."""
    return ch in _ASCII_SPACE or (not ch.isascii() and _SHADOW_TABLE[ord(ch)] == _SPACE)


_PATTERN_TOKEN = re.compile(r"\\p\{(\w+)\}|\\(.)|(\[\^?)|(\])|(.)", re.DOTALL)


def shadow_regex(pattern: str) -> re.Pattern[str]:
    """Compile a ``tokenizers`` regex to a Python regex over shadow strings (see the module
    docstring).  Understood: ASCII literals and escapes, ``\\p{L}`` ``\\p{N}`` ``\\p{P}`` ``\\s`` (also in
    ``[...]``), ``\\S`` (outside ``[...]``), groups such as ``(?i:...)`` / ``(?!...)``, quantifiers.
    Anything else (another class, a non-ASCII literal) raises ValueError naming it."""
    out: list[str] = []
    inside = False
    for m in _PATTERN_TOKEN.finditer(pattern):
        prop, esc, open_, close, lit = m.groups()
        if prop is not None:
            if prop not in ("L", "N", "P"):
                raise ValueError(f"\\p{{{prop}}} is not a class webtensor's pure-Python tokenizer knows")
            out.append(_CLASSES[prop] if inside else f"[{_CLASSES[prop]}]")
        elif esc is not None:
            if esc == "s":
                out.append(_CLASSES["s"] if inside else f"[{_CLASSES['s']}]")
            elif esc == "S" and not inside:
                out.append(f"[^{_CLASSES['s']}]")
            elif esc in "rnt" or (esc.isascii() and not esc.isalnum()):
                out.append("\\" + esc)
            else:
                raise ValueError(f"the escape \\{esc} is not one webtensor's pure-Python tokenizer knows")
        elif open_ is not None:
            if inside:
                raise ValueError("nested character classes are not supported")
            inside = True
            out.append(open_)
        elif close is not None:
            inside = False
            out.append(close)
        else:
            if not lit.isascii():
                raise ValueError(f"the non-ASCII literal {lit!r} is not supported")
            out.append(lit)
    return re.compile("".join(out))


# -- the steps ------------------------------------------------------------------------------------

# A piece on its way through the steps: (text, its shadow).
_Piece = tuple[str, str]


def _isolate(pieces: list[_Piece], regex: re.Pattern[str]) -> list[_Piece]:
    """Split each piece at the matches of `regex` (on the shadow); matches and gaps are pieces."""
    out: list[_Piece] = []
    for text, sh in pieces:
        last = 0
        for m in regex.finditer(sh):
            start, end = m.span()
            if end == start:
                continue
            if start > last:
                out.append((text[last:start], sh[last:start]))
            out.append((text[start:end], sh[start:end]))
            last = end
        if last < len(text):
            out.append((text[last:], sh[last:]))
    return out


@dataclass(frozen=True)
class RegexSplit:
    """``Split(Regex(pattern), behavior="Isolated", invert=False)``."""

    pattern: str
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", shadow_regex(self.pattern))

    def split(self, pieces: list[_Piece]) -> list[_Piece]:
        return _isolate(pieces, self._regex)


@dataclass(frozen=True)
class DigitsSplit:
    """``Digits(individual_digits)``: numbers (Rust's ``char::is_numeric``, i.e. ``N*``) isolated,
    each on its own or in runs."""

    individual_digits: bool
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        numeric = f"[0-9{_NUMBER}{_RUST_DIGIT}]"
        object.__setattr__(self, "_regex", re.compile(numeric if self.individual_digits else numeric + "+"))

    def split(self, pieces: list[_Piece]) -> list[_Piece]:
        return _isolate(pieces, self._regex)


_GPT2_REGEX = shadow_regex(GPT2_PATTERN)


@dataclass(frozen=True)
class ByteLevelStep:
    """The ByteLevel pre-tokenizer: optional prefix space, optional GPT-2 regex split."""

    add_prefix_space: bool = False
    use_regex: bool = True

    def split(self, pieces: list[_Piece]) -> list[_Piece]:
        if self.add_prefix_space:
            pieces = [p if p[0].startswith(" ") else (" " + p[0], " " + p[1]) for p in pieces]
        return _isolate(pieces, _GPT2_REGEX) if self.use_regex else pieces


PreStep = RegexSplit | DigitsSplit | ByteLevelStep


def run_steps(text: str, steps: Sequence[PreStep]) -> list[str]:
    """The pieces `steps` cut `text` into (empty pieces dropped, as ``tokenizers`` drops them)."""
    if not text:
        return []
    pieces: list[_Piece] = [(text, shadow(text))]
    for step in steps:
        pieces = step.split(pieces)
    return [p for p, _ in pieces if p]


_GPT2_SPLIT = (RegexSplit(GPT2_PATTERN),)


def pretokenize(text: str) -> list[str]:
    """Split ``text`` exactly like GPT-2's pre-tokenization regex."""
    return run_steps(text, _GPT2_SPLIT)
