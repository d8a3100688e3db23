"""Pure-Python GPT-2 byte-level BPE tokenizer (standard library only).

This module reproduces, id for id, what the Hugging Face ``tokenizers`` library does for a
GPT-2 style ``tokenizer.json`` (``BPE`` model + ``ByteLevel`` pre-tokenizer/decoder), without
``tokenizers``, ``regex`` or ``numpy``, so that it also runs inside Pyodide.

Pipeline of :meth:`ByteLevelBPE.encode`:

1. **Added tokens** (``<|endoftext|>`` and friends) are found literally in the raw text,
   leftmost-longest, the way ``tokenizers``' ``AddedVocabulary`` does (first the tokens with
   ``normalized=false``, then the ``normalized=true`` ones; no normalizer is supported, so both
   passes see the raw text).  ``lstrip``/``rstrip``/``single_word`` are honoured.
2. Every remaining piece is split by GPT-2's pre-tokenization regex::

       's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

   Python's :mod:`re` has no ``\\p{L}``.  Instead, the text is first translated character by
   character onto an ASCII "shadow" string of the same length (letters -> ``a``, numbers ->
   ``0``, whitespace -> ``\\t``, anything else -> ``!``; ASCII is kept as is, so ``'``,
   the space and the contraction letters stay literal) and an ASCII-only version of the same
   regex is run on the shadow; the match spans are then cut out of the original text.  Because
   the regex only ever looks at those literals and at the four character classes, the spans are
   identical to those of the original regex.  Character classes: ``\\p{L}``/``\\p{N}`` are the
   Unicode general categories ``L*``/``N*`` (from :mod:`unicodedata`); ``\\s`` is Oniguruma's
   Unicode whitespace, i.e. U+0009..U+000D, U+0085 and categories ``Zs``/``Zl``/``Zp`` (note:
   *not* ``str.isspace()``, which also accepts U+001C..U+001F).  Code points that the running
   Python's Unicode database leaves unassigned but that ``tokenizers`` (Unicode 16) knows as
   letters/numbers are patched in from a small table, so the split matches ``tokenizers`` even on
   Python 3.11 (Unicode 14).
3. Every word is UTF-8 encoded and mapped through GPT-2's bytes-to-unicode table, then BPE
   merged by merge rank (same priority-queue algorithm as ``tokenizers``, results cached).

:meth:`ByteLevelBPE.decode_bytes` returns the raw bytes of a sequence of ids (useful for a
streamer that must wait for complete UTF-8 characters); :meth:`ByteLevelBPE.decode` decodes
them with ``errors="replace"`` like ``tokenizers``' ``ByteLevel`` decoder.
"""

from __future__ import annotations

import heapq
import json
import re
import unicodedata
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

__all__ = [
    "AddedToken",
    "ByteLevelBPE",
    "TokenizerFormatError",
    "bytes_to_unicode",
    "pretokenize",
]

StrPath = str | PathLike[str]

ENDOFTEXT = "<|endoftext|>"

# Words longer than this many characters are not cached (same idea as tokenizers' MAX_LENGTH).
_CACHE_MAX_WORD_LEN = 256
_CACHE_MAX_ENTRIES = 10_000


class TokenizerFormatError(ValueError):
    """A tokenizer file (tokenizer.json, vocab.json, merges.txt) is malformed or unsupported."""


# ---------------------------------------------------------------------------------------------
# Byte <-> unicode table
# ---------------------------------------------------------------------------------------------


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters.

    Printable Latin-1 bytes map to themselves; the others (controls, space, ...) are shifted to
    U+0100 and up, so that e.g. the space byte becomes ``"Ġ"`` and newline ``"Ċ"``.
    """
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table: dict[int, str] = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return dict(sorted(table.items()))


_BYTE_ENCODER: dict[int, str] = bytes_to_unicode()
_BYTE_DECODER: dict[str, int] = {c: b for b, c in _BYTE_ENCODER.items()}
# str.translate table applied to ``utf8_bytes.decode("latin-1")``: latin-1 char -> byte-level char.
_LATIN1_TO_BYTELEVEL: dict[int, str] = dict(_BYTE_ENCODER)


def _to_byte_level(text: str) -> str:
    """UTF-8 encode ``text`` and spell each byte with its bytes-to-unicode character."""
    return text.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTELEVEL)


# ---------------------------------------------------------------------------------------------
# Pre-tokenization (GPT-2 regex without the `regex` module)
# ---------------------------------------------------------------------------------------------

# ASCII-only twin of GPT-2's pattern, run on the shadow string.  Classes:
#   L = [A-Za-z]   N = [0-9]   S = [\t\n\v\f\r ]   O = everything else.
_S = r"\t\n\x0b\x0c\r "
_SHADOW_PATTERN = re.compile(
    rf"'s|'t|'re|'ve|'m|'ll|'d"
    rf"| ?[A-Za-z]+"
    rf"| ?[0-9]+"
    rf"| ?[^{_S}A-Za-z0-9]+"
    rf"|[{_S}]+(?![^{_S}])"
    rf"|[{_S}]+"
)

_SHADOW_LETTER = ord("a")
_SHADOW_NUMBER = ord("0")
_SHADOW_SPACE = ord("\t")
_SHADOW_OTHER = ord("!")

# Letters (L) and numbers (N) known to tokenizers' Oniguruma (Unicode 16.0) that are still
# unassigned (Cn) in Python 3.11's unicodedata (Unicode 14.0).  Only consulted for code points
# that the running Python reports as Cn, so newer Pythons simply never need it.
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


def _parse_ranges(spec: str, shadow: int) -> list[tuple[int, int, int]]:
    out = []
    for item in spec.split():
        lo, _, hi = item.partition("-")
        out.append((int(lo, 16), int(hi or lo, 16), shadow))
    return out


_PATCH = sorted(_parse_ranges(_PATCH_L, _SHADOW_LETTER) + _parse_ranges(_PATCH_N, _SHADOW_NUMBER))
_PATCH_STARTS = [lo for lo, _, _ in _PATCH]

_EXTRA_SPACES = frozenset({0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x85})


def _char_class(cp: int) -> int:
    """Shadow character (as an ordinal) for a code point: letter, number, space or other."""
    cat = unicodedata.category(chr(cp))
    major = cat[0]
    if major == "L":
        return _SHADOW_LETTER
    if major == "N":
        return _SHADOW_NUMBER
    if cat in ("Zs", "Zl", "Zp") or cp in _EXTRA_SPACES:
        return _SHADOW_SPACE
    if cat == "Cn":
        i = bisect_right(_PATCH_STARTS, cp) - 1
        if i >= 0 and _PATCH[i][0] <= cp <= _PATCH[i][1]:
            return _PATCH[i][2]
    return _SHADOW_OTHER


class _ShadowTable(dict[int, int]):
    """``str.translate`` table that classifies (and memoizes) code points on first use."""

    def __missing__(self, cp: int) -> int:
        shadow = _char_class(cp)
        self[cp] = shadow
        return shadow


# ASCII maps to itself (controls such as U+001C..U+001F are "other" in the ASCII pattern too).
_SHADOW_TABLE = _ShadowTable({cp: cp for cp in range(128)})


def _is_ws(ch: str) -> bool:
    """Unicode ``\\s`` as Rust regex / Oniguruma see it (White_Space); used for lstrip/rstrip."""
    cp = ord(ch)
    if cp < 128:
        return ch in "\t\n\x0b\x0c\r "
    return _SHADOW_TABLE[cp] == _SHADOW_SPACE


def pretokenize(text: str) -> list[str]:
    """Split ``text`` exactly like GPT-2's pre-tokenization regex (see the module docstring)."""
    shadow = text.translate(_SHADOW_TABLE)
    return [text[m.start() : m.end()] for m in _SHADOW_PATTERN.finditer(shadow)]


def _is_word_char(ch: str) -> bool:
    """Approximation of Rust regex's Unicode ``\\w`` (used only for ``single_word`` tokens).

    Rust: Alphabetic | M | Nd | Pc | Join_Control.  Here: L | Nl | Nd | M | Pc | ZWNJ/ZWJ (the
    few non-letter Alphabetic symbols such as circled letters are not covered).
    """
    if ch in "\u200c\u200d":
        return True
    cat = unicodedata.category(ch)
    return cat[0] in "LM" or cat in ("Nd", "Nl", "Pc")


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AddedToken:
    """A token matched literally in the input before pre-tokenization (HF ``added_tokens``)."""

    content: str
    id: int
    special: bool = True
    single_word: bool = False
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = False


class _AddedTokenMatcher:
    """Leftmost-longest literal matcher for one set of added tokens (one AddedVocabulary trie)."""

    def __init__(self, tokens: Sequence[AddedToken]) -> None:
        # Same content twice: the last definition wins (like tokenizers' maps).
        by_content = {t.content: t for t in tokens if t.content}
        self.by_content = by_content
        if by_content:
            # Python's alternation takes the first alternative that matches at the leftmost
            # position, so ordering longest-first yields leftmost-longest (aho-corasick) semantics.
            alts = sorted(by_content, key=lambda s: (-len(s), s))
            self.pattern: re.Pattern[str] | None = re.compile("|".join(map(re.escape, alts)))
        else:
            self.pattern = None

    def split(self, text: str) -> list[tuple[str, int | None]]:
        """Split ``text`` into ``(piece, added_token_id_or_None)`` covering the whole text."""
        if self.pattern is None or not text:
            return [(text, None)]
        splits: list[tuple[str, int | None]] = []
        start_offset = 0
        n = len(text)
        for m in self.pattern.finditer(text):
            start, stop = m.start(), m.end()
            tok = self.by_content[m.group()]
            if tok.single_word:
                start_space = start == 0 or not _is_word_char(text[start - 1])
                stop_space = stop == n or not _is_word_char(text[stop])
                if not (start_space and stop_space):
                    continue
            if tok.lstrip:
                new_start = start
                while new_start > 0 and _is_ws(text[new_start - 1]):
                    new_start -= 1
                start = max(new_start, start_offset)
            if tok.rstrip:
                while stop < n and _is_ws(text[stop]):
                    stop += 1
            if start_offset < start:
                splits.append((text[start_offset:start], None))
            splits.append((text[start:stop], tok.id))
            start_offset = stop
        if start_offset != n:
            splits.append((text[start_offset:], None))
        return splits


class ByteLevelBPE:
    """GPT-2 byte-level BPE tokenizer, id-for-id compatible with Hugging Face ``tokenizers``.

    Build it with :meth:`from_dir`, :meth:`from_tokenizer_json` or :meth:`from_files`.
    """

    def __init__(
        self,
        vocab: Mapping[str, int],
        merges: Iterable[tuple[str, str]],
        added_tokens: Iterable[AddedToken] = (),
        *,
        add_prefix_space: bool = False,
        use_regex: bool = True,
        unk_token: str | None = None,
        fuse_unk: bool = False,
        ignore_merges: bool = False,
    ) -> None:
        """Create a tokenizer from an in-memory vocabulary and merge list.

        Args:
            vocab: token (in byte-level spelling, e.g. ``"Ġthe"``) -> id.
            merges: pairs ``(left, right)`` in rank order (first = merged first).
            added_tokens: tokens matched literally before pre-tokenization.
            add_prefix_space: prepend a space to every non-empty piece that lacks one.
            use_regex: split pieces with GPT-2's regex (``False``: each piece is one word).
            unk_token: token used for characters missing from the vocabulary (``None``: such
                characters are dropped, as ``tokenizers`` does).
            fuse_unk: merge consecutive unknown characters into a single ``unk_token``.
            ignore_merges: a word that is itself in the vocabulary is emitted as one token.

        Raises:
            TokenizerFormatError: invalid vocabulary, merge or added token.
        """
        self._vocab: dict[str, int] = {}
        for token, idx in vocab.items():
            if not isinstance(token, str) or type(idx) is not int or idx < 0:
                raise TokenizerFormatError(
                    f"vocabulary entry {token!r}: {idx!r} must map a string to a non-negative int"
                )
            self._vocab[token] = idx
        self._id_to_token: dict[int, str] = {}
        for token, idx in self._vocab.items():
            if idx in self._id_to_token:
                raise TokenizerFormatError(
                    f"vocabulary id {idx} is used by both {self._id_to_token[idx]!r} and {token!r}"
                )
            self._id_to_token[idx] = token

        # (left_id, right_id) -> (rank, merged_id); a repeated pair keeps its last rank.
        self._merges: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, pair in enumerate(merges):
            if len(pair) != 2:
                raise TokenizerFormatError(f"merge #{rank} must have two parts, got {pair!r}")
            left, right = pair
            ids = []
            for part in (left, right):
                if part not in self._vocab:
                    raise TokenizerFormatError(
                        f"merge #{rank} {left!r} + {right!r}: token {part!r} is not in the vocabulary"
                    )
                ids.append(self._vocab[part])
            merged = left + right
            if merged not in self._vocab:
                raise TokenizerFormatError(
                    f"merge #{rank} {left!r} + {right!r}: result {merged!r} is not in the vocabulary"
                )
            self._merges[(ids[0], ids[1])] = (rank, self._vocab[merged])

        if unk_token is not None and unk_token not in self._vocab:
            raise TokenizerFormatError(f"unk_token {unk_token!r} is not in the vocabulary")
        self._unk_id = None if unk_token is None else self._vocab[unk_token]
        self._fuse_unk = fuse_unk
        self._ignore_merges = ignore_merges
        self.add_prefix_space = add_prefix_space
        self.use_regex = use_regex

        # Added tokens: content -> AddedToken, id -> AddedToken.
        self._added: dict[str, AddedToken] = {}
        self._added_by_id: dict[int, AddedToken] = {}
        for tok in added_tokens:
            if type(tok.id) is not int or tok.id < 0:
                raise TokenizerFormatError(f"added token {tok.content!r} has an invalid id {tok.id!r}")
            if not tok.content:
                continue
            if tok.content in self._vocab and self._vocab[tok.content] != tok.id:
                raise TokenizerFormatError(
                    f"added token {tok.content!r} has id {tok.id} but the vocabulary "
                    f"says {self._vocab[tok.content]}"
                )
            other = self._id_to_token.get(tok.id)
            if other is not None and other != tok.content:
                raise TokenizerFormatError(
                    f"added token {tok.content!r} reuses id {tok.id} of vocabulary token {other!r}"
                )
            self._added[tok.content] = tok
            self._added_by_id[tok.id] = tok
        toks = list(self._added.values())
        self._raw_matcher = _AddedTokenMatcher([t for t in toks if not t.normalized])
        self._norm_matcher = _AddedTokenMatcher([t for t in toks if t.normalized])
        self._special_ids = frozenset(t.id for t in toks if t.special)
        self._vocab_size = max([-1, *self._id_to_token, *self._added_by_id]) + 1

        self._cache: dict[str, tuple[int, ...]] = {}
        self._bytes_cache: dict[int, bytes] = {}

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_dir(cls, path: StrPath) -> ByteLevelBPE:
        """Load from a directory holding ``tokenizer.json`` or ``vocab.json`` + ``merges.txt``.

        ``tokenizer.json`` is preferred when both are present.
        """
        d = Path(path)
        if not d.is_dir():
            raise FileNotFoundError(f"tokenizer directory not found: {d}")
        if (d / "tokenizer.json").is_file():
            return cls.from_tokenizer_json(d / "tokenizer.json")
        if (d / "vocab.json").is_file() and (d / "merges.txt").is_file():
            return cls.from_files(d / "vocab.json", d / "merges.txt")
        raise FileNotFoundError(f"{d} contains neither tokenizer.json nor vocab.json + merges.txt")

    @classmethod
    def from_files(
        cls,
        vocab_json: StrPath,
        merges_txt: StrPath,
        *,
        special_tokens: Sequence[str] = (ENDOFTEXT,),
    ) -> ByteLevelBPE:
        """Load the classic GPT-2 ``vocab.json`` + ``merges.txt`` pair.

        Those of ``special_tokens`` that the vocabulary contains (GPT-2: ``<|endoftext|>``) are
        registered as special added tokens, matched literally in the text; the others are ignored,
        so :attr:`eos_token_id` is ``None`` for a vocabulary without ``<|endoftext|>``.
        """
        vocab = _load_json(vocab_json)
        if not isinstance(vocab, dict):
            raise TokenizerFormatError(f"{vocab_json}: expected a JSON object mapping token -> id")
        merges: list[tuple[str, str]] = []
        text = Path(merges_txt).read_text(encoding="utf-8")
        for lineno, line in enumerate(text.splitlines(), start=1):
            line = line.rstrip("\r\n")
            if (lineno == 1 and line.startswith("#version")) or not line:
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise TokenizerFormatError(f"{merges_txt}:{lineno}: expected 'left right', got {line!r}")
            merges.append((parts[0], parts[1]))
        added = [AddedToken(t, vocab[t], special=True) for t in special_tokens if t in vocab]
        return cls(vocab, merges, added)

    @classmethod
    def from_tokenizer_json(cls, path: StrPath) -> ByteLevelBPE:
        """Load a Hugging Face ``tokenizer.json`` holding a byte-level BPE (GPT-2 style).

        Raises:
            TokenizerFormatError: the file is not a byte-level BPE tokenizer this class supports
                (e.g. it has a normalizer, BPE dropout, a subword prefix/suffix or byte fallback).
        """
        data = _load_json(path)
        return cls.from_tokenizer_dict(data, source=str(path))

    @classmethod
    def from_tokenizer_dict(cls, data: object, *, source: str = "tokenizer.json") -> ByteLevelBPE:
        """Same as :meth:`from_tokenizer_json` for an already parsed JSON document."""

        def fail(msg: str) -> TokenizerFormatError:
            return TokenizerFormatError(f"{source}: {msg}")

        if not isinstance(data, dict):
            raise fail("top level must be a JSON object")
        model = data.get("model")
        if not isinstance(model, dict):
            raise fail("missing 'model' object")
        if model.get("type", "BPE") != "BPE":
            raise fail(f"model type {model.get('type')!r} is not supported (need 'BPE')")
        vocab = model.get("vocab")
        if not isinstance(vocab, dict):
            raise fail("'model.vocab' must be an object mapping token -> id")
        raw_merges = model.get("merges", [])
        if not isinstance(raw_merges, list):
            raise fail("'model.merges' must be a list")
        merges: list[tuple[str, str]] = []
        for i, m in enumerate(raw_merges):
            if isinstance(m, str):
                parts = m.split(" ")
            elif isinstance(m, list):
                parts = m
            else:
                raise fail(f"merge #{i} must be a 'a b' string or an [a, b] pair, got {m!r}")
            if len(parts) != 2 or not all(isinstance(p, str) for p in parts):
                raise fail(f"merge #{i} must have exactly two string parts, got {m!r}")
            merges.append((parts[0], parts[1]))
        for key in ("continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                raise fail(f"'model.{key}' = {model[key]!r} is not supported")
        if model.get("byte_fallback"):
            raise fail("'model.byte_fallback' is not supported")
        dropout = model.get("dropout")
        if dropout not in (None, 0, 0.0):
            raise fail(f"BPE dropout {dropout!r} is not supported (encoding must be deterministic)")

        if data.get("normalizer") is not None:
            raise fail(f"normalizer {data['normalizer'].get('type')!r} is not supported")
        pre = data.get("pre_tokenizer")
        add_prefix_space, use_regex = False, True
        if pre is not None:
            if not isinstance(pre, dict) or pre.get("type") != "ByteLevel":
                kind = pre.get("type") if isinstance(pre, dict) else pre
                raise fail(f"pre_tokenizer {kind!r} is not supported (need 'ByteLevel')")
            add_prefix_space = bool(pre.get("add_prefix_space", False))
            use_regex = bool(pre.get("use_regex", True))
        post = data.get("post_processor")
        if post is not None and (not isinstance(post, dict) or post.get("type") != "ByteLevel"):
            kind = post.get("type") if isinstance(post, dict) else post
            raise fail(f"post_processor {kind!r} is not supported (need null or 'ByteLevel')")
        dec = data.get("decoder")
        if dec is not None and (not isinstance(dec, dict) or dec.get("type") != "ByteLevel"):
            kind = dec.get("type") if isinstance(dec, dict) else dec
            raise fail(f"decoder {kind!r} is not supported (need null or 'ByteLevel')")

        added: list[AddedToken] = []
        raw_added = data.get("added_tokens") or []
        if not isinstance(raw_added, list):
            raise fail("'added_tokens' must be a list")
        for i, entry in enumerate(raw_added):
            if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
                raise fail(f"added token #{i} needs a string 'content'")
            if type(entry.get("id")) is not int:
                raise fail(f"added token {entry['content']!r} needs an integer 'id'")
            added.append(
                AddedToken(
                    content=entry["content"],
                    id=entry["id"],
                    special=bool(entry.get("special", False)),
                    single_word=bool(entry.get("single_word", False)),
                    lstrip=bool(entry.get("lstrip", False)),
                    rstrip=bool(entry.get("rstrip", False)),
                    normalized=bool(entry.get("normalized", not entry.get("special", False))),
                )
            )
        try:
            return cls(
                vocab,
                merges,
                added,
                add_prefix_space=add_prefix_space,
                use_regex=use_regex,
                unk_token=model.get("unk_token"),
                fuse_unk=bool(model.get("fuse_unk", False)),
                ignore_merges=bool(model.get("ignore_merges", False)),
            )
        except TokenizerFormatError as e:
            raise fail(str(e)) from None

    # -- vocabulary ---------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of embedding rows the ids need: largest id (vocabulary or added) + 1."""
        return self._vocab_size

    @property
    def eos_token_id(self) -> int | None:
        """Id of ``<|endoftext|>`` if the tokenizer has it, else ``None``."""
        return self.token_to_id(ENDOFTEXT)

    def token_to_id(self, token: str) -> int | None:
        """Id of a token (byte-level spelling, e.g. ``"Ġthe"``, or an added token), or ``None``."""
        tok = self._added.get(token)
        if tok is not None:
            return tok.id
        return self._vocab.get(token)

    def id_to_token(self, idx: int) -> str | None:
        """Token string for an id, or ``None`` if the id is unknown."""
        tok = self._added_by_id.get(idx)
        if tok is not None:
            return tok.content
        return self._id_to_token.get(idx)

    def is_special(self, idx: int) -> bool:
        """Whether ``idx`` is a special added token (e.g. ``<|endoftext|>``)."""
        return idx in self._special_ids

    @property
    def added_tokens(self) -> tuple[AddedToken, ...]:
        """The added tokens, in id order."""
        return tuple(sorted(self._added.values(), key=lambda t: t.id))

    # -- encoding -----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids for ``text`` (added/special tokens in the text are recognised literally)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() expects str, got {type(text).__name__}")
        ids: list[int] = []
        for piece, tid in self._split_added(text):
            if tid is not None:
                ids.append(tid)
            else:
                self._encode_ordinary(piece, ids)
        return ids

    def _split_added(self, text: str) -> list[tuple[str, int | None]]:
        out: list[tuple[str, int | None]] = []
        for piece, tid in self._raw_matcher.split(text):
            if tid is None:
                out.extend(self._norm_matcher.split(piece))
            else:
                out.append((piece, tid))
        return out

    def _encode_ordinary(self, text: str, out: list[int]) -> None:
        if not text:
            return
        if self.add_prefix_space and not text.startswith(" "):
            text = " " + text
        words = pretokenize(text) if self.use_regex else [text]
        cache = self._cache
        for word in words:
            bl = _to_byte_level(word)
            hit = cache.get(bl)
            if hit is None:
                hit = self._bpe(bl)
                if len(bl) < _CACHE_MAX_WORD_LEN:
                    if len(cache) >= _CACHE_MAX_ENTRIES:
                        cache.clear()
                    cache[bl] = hit
            out.extend(hit)

    def _bpe(self, word: str) -> tuple[int, ...]:
        """BPE-merge one byte-level word, with the same priority queue as ``tokenizers``."""
        vocab = self._vocab
        if self._ignore_merges:
            whole = vocab.get(word)
            if whole is not None:
                return (whole,)
        ids: list[int] = []
        unk_run = False
        for ch in word:
            idx = vocab.get(ch)
            if idx is not None:
                ids.append(idx)
                unk_run = False
            elif self._unk_id is not None:
                if not (self._fuse_unk and unk_run):
                    ids.append(self._unk_id)
                unk_run = True
            # else: dropped, as tokenizers does without an unk token
        n = len(ids)
        if n < 2:
            return tuple(ids)
        merges = self._merges
        heap = []
        for i in range(n - 1):
            m = merges.get((ids[i], ids[i + 1]))
            if m is not None:
                heap.append((m[0], i, m[1]))
        if not heap:
            return tuple(ids)
        heapq.heapify(heap)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        alive = [True] * n
        while heap:
            _, pos, new_id = heapq.heappop(heap)
            if not alive[pos]:
                continue
            right = nxt[pos]
            if right == -1:
                continue
            m = merges.get((ids[pos], ids[right]))
            if m is None or m[1] != new_id:
                continue  # stale queue entry
            ids[pos] = new_id
            alive[right] = False
            after = nxt[right]
            nxt[pos] = after
            if after != -1:
                prev[after] = pos
            before = prev[pos]
            if before != -1:
                m = merges.get((ids[before], new_id))
                if m is not None:
                    heapq.heappush(heap, (m[0], before, m[1]))
            if after != -1:
                m = merges.get((new_id, ids[after]))
                if m is not None:
                    heapq.heappush(heap, (m[0], pos, m[1]))
        return tuple(idx for idx, keep in zip(ids, alive, strict=True) if keep)

    # -- decoding -----------------------------------------------------------------------------

    def token_bytes(self, idx: int) -> bytes:
        """Raw bytes that token ``idx`` stands for.

        Like ``tokenizers``' ByteLevel decoder, a token made only of bytes-to-unicode characters
        yields those bytes; any other token (e.g. an added token with arbitrary text) yields its
        UTF-8 encoding.

        Raises:
            ValueError: ``idx`` is not a known token id.
        """
        cached = self._bytes_cache.get(idx)
        if cached is not None:
            return cached
        token = self.id_to_token(idx)
        if token is None:
            raise ValueError(f"token id {idx!r} is not in the vocabulary (size {self.vocab_size})")
        dec = _BYTE_DECODER
        if all(ch in dec for ch in token):
            raw = bytes(dec[ch] for ch in token)
        else:
            raw = token.encode("utf-8")
        self._bytes_cache[idx] = raw
        return raw

    def decode_bytes(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> bytes:
        """Concatenated raw bytes of ``ids`` (may end in the middle of a UTF-8 character)."""
        special = self._special_ids
        return b"".join(self.token_bytes(i) for i in ids if not (skip_special_tokens and i in special))

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Text for ``ids``; invalid UTF-8 is replaced by U+FFFD (``errors="replace"``)."""
        return self.decode_bytes(ids, skip_special_tokens=skip_special_tokens).decode(
            "utf-8", errors="replace"
        )

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(vocab_size={self.vocab_size}, merges={len(self._merges)}, "
            f"added_tokens={len(self._added)})"
        )


def _load_json(path: StrPath) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise TokenizerFormatError(f"{path}: invalid JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise TokenizerFormatError(f"{path}: not valid UTF-8: {e}") from None
