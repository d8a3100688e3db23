"""Pure-Python byte-level BPE tokenizer (standard library only).

This module reproduces, id for id, what the Hugging Face ``tokenizers`` library does for a
byte-level BPE ``tokenizer.json`` (GPT-2, Llama 3, Qwen2/2.5/3, SmolLM2: a ``BPE`` model, a
``ByteLevel`` decoder), without ``tokenizers``, ``regex`` or ``numpy``, so that it also runs inside
Pyodide.

Pipeline of :meth:`ByteLevelBPE.encode`:

1. **Added tokens** (``<|endoftext|>`` and friends) are found literally in the raw text,
   leftmost-longest, the way ``tokenizers``' ``AddedVocabulary`` does: first the tokens with
   ``normalized=false`` in the raw text, then the rest of the text is normalized (``unicode_norm``)
   and the ``normalized=true`` ones are found in it.  ``lstrip``/``rstrip``/``single_word`` are
   honoured.
2. Every remaining piece goes through the pre-tokenizer steps (``pretok``: regex splits such as
   GPT-2's, Llama 3's or Qwen2's, SmolLM's digit split, then ``ByteLevel``).
3. Every word is UTF-8 encoded and mapped through GPT-2's bytes-to-unicode table, then BPE
   merged by merge rank (same priority-queue algorithm as ``tokenizers``, results cached);
   with ``ignore_merges`` (Llama 3) a word that is itself in the vocabulary is one token.

:meth:`ByteLevelBPE.decode_bytes` returns the raw bytes of a sequence of ids (useful for a
streamer that must wait for complete UTF-8 characters); :meth:`ByteLevelBPE.decode` decodes
them with ``errors="replace"`` like ``tokenizers``' ``ByteLevel`` decoder.
"""

from __future__ import annotations

import heapq
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from os import PathLike
from pathlib import Path

from .pretok import ByteLevelStep, is_whitespace, pretokenize, run_steps
from .tokenizer_files import (
    ENDOFTEXT,
    AddedToken,
    TokenizerFormatError,
    TokenizerSpec,
    parse_tokenizer_json,
    read_tokenizer_dir,
    read_tokenizer_json,
    read_vocab_merges,
)
from .unicode_norm import make_normalizer

__all__ = [
    "AddedToken",
    "ByteLevelBPE",
    "TokenizerFormatError",
    "byte_level_bytes",
    "bytes_to_unicode",
    "pretokenize",
]

StrPath = str | PathLike[str]

# Words longer than this many characters are not cached (same idea as tokenizers' MAX_LENGTH).
_CACHE_MAX_WORD_LEN = 256
_CACHE_MAX_ENTRIES = 10_000


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


def byte_level_bytes(token: str) -> bytes:
    """The bytes a token stands for, as ``tokenizers``' ByteLevel decoder reads it.

    A token made only of bytes-to-unicode characters yields those bytes; any other token (e.g.
    an added token with arbitrary text) yields its UTF-8 encoding, whole.
    """
    dec = _BYTE_DECODER
    if all(ch in dec for ch in token):
        return bytes(dec[ch] for ch in token)
    return token.encode("utf-8")


def _to_byte_level(text: str) -> str:
    """UTF-8 encode ``text`` and spell each byte with its bytes-to-unicode character."""
    return text.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTELEVEL)


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


class _AddedTokenMatcher:
    """Leftmost-longest literal matcher for one set of added tokens (one AddedVocabulary trie)."""

    def __init__(self, tokens: Sequence[AddedToken], normalize: Callable[[str], str] | None = None) -> None:
        # Contents are matched as `normalize` spells them (tokenizers normalizes the contents of
        # `normalized` tokens too).  Same content twice: the last definition wins.
        by_content = {(normalize(t.content) if normalize else t.content): t for t in tokens}
        by_content.pop("", None)
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
                while new_start > 0 and is_whitespace(text[new_start - 1]):
                    new_start -= 1
                start = max(new_start, start_offset)
            if tok.rstrip:
                while stop < n and is_whitespace(text[stop]):
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

    Build it with :meth:`from_dir`, :meth:`from_tokenizer_json`, :meth:`from_files` or
    :meth:`from_spec` (a :class:`TokenizerSpec` checked by ``tokenizer_files``).
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
        spec = TokenizerSpec(
            dict(vocab), [tuple(m) for m in merges], tuple(added_tokens),  # type: ignore[misc]
            pre_steps=(ByteLevelStep(add_prefix_space, use_regex),), unk_token=unk_token,
            fuse_unk=fuse_unk, ignore_merges=ignore_merges, source="ByteLevelBPE",
        )
        self._build(spec)

    def _build(self, spec: TokenizerSpec) -> None:
        """Set up the lookup tables of an already checked spec."""
        self.spec = spec
        self._vocab: dict[str, int] = dict(spec.vocab)
        self._id_to_token: dict[int, str] = spec.id_to_token
        # (left_id, right_id) -> (rank, merged_id); a repeated pair keeps its last rank.
        vocab = self._vocab
        self._merges: dict[tuple[int, int], tuple[int, int]] = {
            (vocab[a], vocab[b]): (rank, vocab[a + b]) for rank, (a, b) in enumerate(spec.merges)
        }
        self._unk_id = vocab[spec.unk_token] if spec.unk_token is not None else None
        self._fuse_unk = spec.fuse_unk
        self._ignore_merges = spec.ignore_merges
        self._normalize = make_normalizer(spec.normalizers)
        self._pre_steps = spec.pre_steps
        # Added tokens: content -> AddedToken, id -> AddedToken.
        self._added: dict[str, AddedToken] = {t.content: t for t in spec.added_tokens}
        self._added_by_id: dict[int, AddedToken] = {t.id: t for t in spec.added_tokens}
        toks = list(self._added.values())
        self._raw_matcher = _AddedTokenMatcher([t for t in toks if not t.normalized])
        # Normalized added tokens are matched on normalized text, by their normalized content.
        self._norm_matcher = _AddedTokenMatcher([t for t in toks if t.normalized], self._normalize)
        self._special_ids = spec.special_ids
        self._vocab_size = spec.vocab_size
        self._cache: dict[str, tuple[int, ...]] = {}
        self._bytes_cache: dict[int, bytes] = {}

    @property
    def add_prefix_space(self) -> bool:
        """Whether the ByteLevel pre-tokenizer prepends a space to pieces that lack one."""
        return any(isinstance(s, ByteLevelStep) and s.add_prefix_space for s in self._pre_steps)

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_spec(cls, spec: TokenizerSpec) -> ByteLevelBPE:
        """Build from a checked :class:`TokenizerSpec` (see ``tokenizer_files``)."""
        self = cls.__new__(cls)
        self._build(spec)
        return self

    @classmethod
    def from_dir(cls, path: StrPath) -> ByteLevelBPE:
        """Load from a directory holding ``tokenizer.json`` or ``vocab.json`` + ``merges.txt``.

        ``tokenizer.json`` is preferred when both are present.
        """
        d = Path(path)
        if not d.is_dir():
            raise FileNotFoundError(f"tokenizer directory not found: {d}")
        if not (d / "tokenizer.json").is_file() and not ((d / "vocab.json").is_file() and (d / "merges.txt").is_file()):
            raise FileNotFoundError(f"{d} contains neither tokenizer.json nor vocab.json + merges.txt")
        return cls.from_spec(read_tokenizer_dir(d))

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
        return cls.from_spec(read_vocab_merges(vocab_json, merges_txt, special_tokens=special_tokens))

    @classmethod
    def from_tokenizer_json(cls, path: StrPath) -> ByteLevelBPE:
        """Load a Hugging Face ``tokenizer.json`` holding a byte-level BPE (GPT-2 style).

        Raises:
            TokenizerFormatError: the file is not a byte-level BPE tokenizer this class supports
                (``tokenizer_files`` lists what is); the message names the field.
        """
        return cls.from_spec(read_tokenizer_json(path))

    @classmethod
    def from_tokenizer_dict(cls, data: object, *, source: str = "tokenizer.json") -> ByteLevelBPE:
        """Same as :meth:`from_tokenizer_json` for an already parsed JSON document."""
        return cls.from_spec(parse_tokenizer_json(data, source=source))

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
        return self._id_to_token.get(idx)

    def is_special(self, idx: int) -> bool:
        """Whether ``idx`` is a special added token (e.g. ``<|endoftext|>``)."""
        return idx in self._special_ids

    @property
    def added_tokens(self) -> tuple[AddedToken, ...]:
        """The added tokens, in id order."""
        return tuple(sorted(self._added.values(), key=lambda t: t.id))

    # -- encoding -----------------------------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids for ``text`` (added/special tokens in the text are recognised literally).

        ``add_special_tokens``: wrap the ids in the post-processor's template (e.g. a BOS token),
        as ``tokenizers``' ``encode(text, add_special_tokens=True)`` does.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() expects str, got {type(text).__name__}")
        ids: list[int] = list(self.spec.prefix_ids) if add_special_tokens else []
        for piece, tid in self._split_added(text):
            if tid is not None:
                ids.append(tid)
            else:
                self._encode_ordinary(piece, ids)
        if add_special_tokens:
            ids.extend(self.spec.suffix_ids)
        return ids

    def _split_added(self, text: str) -> list[tuple[str, int | None]]:
        """Raw-text added tokens first; then normalize the rest and find the normalized ones."""
        out: list[tuple[str, int | None]] = []
        for piece, tid in self._raw_matcher.split(text):
            if tid is None:
                out.extend(self._norm_matcher.split(self._normalize(piece)))
            else:
                out.append((piece, tid))
        return out

    def _encode_ordinary(self, text: str, out: list[int]) -> None:
        if not text:
            return
        cache = self._cache
        for word in run_steps(text, self._pre_steps):
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
        raw = byte_level_bytes(token)
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
