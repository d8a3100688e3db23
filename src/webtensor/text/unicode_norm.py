"""The normalizers of a tokenizer.json (NFC, NFD, NFKC, NFKD, Lowercase) as ``tokenizers`` runs them.

Python's :mod:`unicodedata` is of another Unicode version than ``tokenizers``: its normalization
tables (the ``unicode-normalization-alignments`` crate) are Unicode ~10, its lowercasing (Rust's
``char::to_lowercase``) Unicode 17, while Python 3.11 has Unicode 14 and the page's Pyodide
(Python 3.14) Unicode 16.  Two small tables close the gaps:

* ``_NORM_INERT``: code points that Python (14 or 16) decomposes, reorders or composes but
  ``tokenizers`` does not know.  They are kept as they are and normalization runs on the text
  between them, which is what an unknown character (a starter without decomposition) means to
  ``tokenizers``.  Normalization properties of assigned characters never change (Unicode's
  stability policy), so the table is the same for every Python up to Unicode 16.
* ``_LOWER_PATCH``: lowercase mappings ``tokenizers`` knows for code points that the running
  Python leaves unassigned (consulted only for those, so newer Pythons never need it).

``Lowercase`` maps each character on its own (no final-sigma rule), like ``tokenizers``.
Standard library only (it runs in Pyodide).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from typing import Literal, TypeGuard, get_args

__all__ = ["lowercase", "make_normalizer", "normalize"]

_NORM_INERT_RANGES = (
    "7FD 897-89F 8CA-8D3 9FE C3C D3B-D3C EBA 1715 1ABF-1ACE 1DF6-1DFA 32FF A7F2-A7F4 A82C AB69 "
    "105C9 105D2 105DA 105E4 10781-10785 10787-107B0 107B2-107BA 10D24-10D27 10D69-10D6D "
    "10EAB-10EAC 10EFD-10EFF 10F46-10F50 10F82-10F85 11070 1133B 11382-11385 1138B 1138E "
    "11390-11391 113B8 113BB 113C2 113C5 113C7-113C9 113CE-113D0 1145E 11839-1183A 11930 11938 "
    "1193D-1193E 11943 119E0 11A34 11A47 11A99 11D42 11D44-11D45 11D97 11F41-11F42 1611E-16129 "
    "1612F 16D63 16D67-16D6A 16FF0-16FF1 1CCD6-1CCF9 1E030-1E06D 1E08F 1E130-1E136 1E2AE "
    "1E2EC-1E2EF 1E4EC-1E4EF 1E5EE-1E5EF 1F16C 1FBF0-1FBF9"
)

# code point -> its lowercase (hex code points), where Python 3.11 has the code point unassigned.
_LOWER_PATCH_SPEC = (
    "1C89:1C8A A7CB:264 A7CC:A7CD A7CE:A7CF A7D2:A7D3 A7D4:A7D5 A7DA:A7DB A7DC:19B "
    + " ".join(f"{c:X}:{c + 0x20:X}" for c in range(0x10D50, 0x10D66))
    + " "
    + " ".join(f"{c:X}:{c + 0x1B:X}" for c in range(0x16EA0, 0x16EB9))
)


def _ranges(spec: str) -> list[tuple[int, int]]:
    out = []
    for item in spec.split():
        lo, _, hi = item.partition("-")
        out.append((int(lo, 16), int(hi or lo, 16)))
    return out


_NORM_INERT = _ranges(_NORM_INERT_RANGES)
# Splits text into runs and single inert characters (kept by the capturing group).
_INERT_SPLIT = re.compile(
    "([" + "".join(re.escape(chr(lo)) + ("-" + re.escape(chr(hi)) if hi > lo else "") for lo, hi in _NORM_INERT) + "])"
)
_LOWER_PATCH: dict[int, str] = {
    int(k, 16): chr(int(v, 16)) for k, v in (item.split(":") for item in _LOWER_PATCH_SPEC.split())
}


Form = Literal["NFC", "NFD", "NFKC", "NFKD"]


def is_form(name: str) -> TypeGuard[Form]:
    """Whether `name` is one of the four Unicode normalization forms."""
    return name in get_args(Form)


def normalize(form: Form, text: str) -> str:
    """Unicode normalization ``form`` (NFC, NFD, NFKC, NFKD) as ``tokenizers`` does it."""
    if text.isascii():
        return text
    parts = _INERT_SPLIT.split(text)
    if len(parts) == 1:
        return unicodedata.normalize(form, text)
    # Even indices: runs between inert characters; odd indices: the inert characters themselves.
    return "".join(p if i % 2 else unicodedata.normalize(form, p) for i, p in enumerate(parts))


class _LowerTable(dict[int, str]):
    """``str.translate`` table: each character's own lowercase, memoized on first use."""

    def __missing__(self, cp: int) -> str:
        ch = chr(cp)
        low = _LOWER_PATCH.get(cp, ch) if unicodedata.category(ch) == "Cn" else ch.lower()
        self[cp] = low
        return low


_LOWER = _LowerTable()


def lowercase(text: str) -> str:
    """Lowercase character by character, as ``tokenizers``' ``Lowercase`` normalizer does."""
    return text.lower() if text.isascii() else text.translate(_LOWER)


def make_normalizer(steps: Sequence[str]) -> Callable[[str], str]:
    """One function applying the normalizer chain ``steps`` (names from ``NORMALIZERS``)."""
    funcs = [_step(name) for name in steps]
    if not funcs:
        return _identity

    def run(text: str) -> str:
        for f in funcs:
            text = f(text)
        return text

    return run


def _step(name: str) -> Callable[[str], str]:
    if name == "Lowercase":
        return lowercase
    if not is_form(name):
        raise ValueError(f"unknown normalizer {name!r} (need NFC, NFD, NFKC, NFKD or Lowercase)")
    form = name
    return lambda text: normalize(form, text)


def _identity(text: str) -> str:
    return text
