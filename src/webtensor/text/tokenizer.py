"""The GPT-2 tokenizer: byte-level BPE from tokenizer.json or vocab.json + merges.txt.

The files are read and checked once by `tokenizer_files` (the same checker the page uses), then
encoded by Hugging Face `tokenizers` where it is installed, else (the browser) by the pure-Python
`bpe` module, which gives the same ids.  Decoding is the same code on both paths (the ByteLevel
decoder's rule over the checked vocabulary).  `token_bytes` lets a streamer emit only whole
UTF-8 characters."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import TokenizerError
from .bpe import ByteLevelBPE, byte_level_bytes
from .tokenizer_files import AddedToken, TokenizerSpec, read_tokenizer_dir


class GPT2Tokenizer:
    """Encode with `tokenizers` (kind "tokenizers") or the pure-Python BPE (kind "pure-python")."""

    def __init__(self, backend: Any, kind: str, spec: TokenizerSpec):
        self._tok, self.kind, self.spec = backend, kind, spec
        self.vocab_size = spec.vocab_size
        ids = {t.content: t.id for t in spec.added_tokens}
        self.eos_token_id: int | None = ids.get("<|endoftext|>", spec.vocab.get("<|endoftext|>"))
        self._special = spec.special_ids
        self._bytes_cache: dict[int, bytes] = {}

    @classmethod
    def from_dir(cls, d: Path, *, native: bool | None = None) -> GPT2Tokenizer:
        """Read the tokenizer of checkpoint directory `d`. `native`: use `tokenizers` (None: where
        installed). Files outside what `tokenizer_files` accepts raise a TokenizerError (a
        CheckpointError) naming the field, on both paths alike."""
        spec = read_tokenizer_dir(d)
        if not (_have_tokenizers() if native is None else native):
            return cls(ByteLevelBPE.from_spec(spec), "pure-python", spec)
        return cls(_native_tokenizer(Path(d), spec), "tokenizers", spec)

    @classmethod
    def from_vocab(cls, tokens: Sequence[str], merges: Sequence[tuple[str, str]], special: Iterable[int] = (),
                   added: Iterable[int] = (), source: str = "vocabulary") -> GPT2Tokenizer:
        """A byte-level BPE from memory (e.g. a GGUF file's metadata): `tokens` in id order, in
        byte-level spelling ("Ġthe"), `merges` in rank order; ids in `special` are special added
        tokens (<|endoftext|>), ids in `added` ordinary added tokens, both matched literally."""
        vocab = {t: i for i, t in enumerate(tokens)}
        if len(vocab) != len(tokens):
            dup = next(t for i, t in enumerate(tokens) if vocab[t] != i)
            raise TokenizerError(f"{source}: token {dup!r} appears more than once in the vocabulary")
        special, added = sorted(set(special)), sorted(set(added) - set(special))
        bad = [i for i in (*special, *added) if not 0 <= i < len(tokens)]
        if bad:
            raise TokenizerError(f"{source}: added token id {bad[0]} is outside the vocabulary of {len(tokens)}")
        extra = [AddedToken(tokens[i], i, special=True) for i in special]
        extra += [AddedToken(tokens[i], i, special=False) for i in added]
        spec = TokenizerSpec(vocab, list(merges), extra, source=source)
        if not _have_tokenizers():
            return cls(ByteLevelBPE.from_spec(spec), "pure-python", spec)
        return cls(_native_from_spec(spec), "tokenizers", spec)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TokenizerError(f"the text to encode must be a str, got {type(text).__name__}")
        if self.kind == "tokenizers":
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        return self._tok.encode(text)

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Text for `ids` like `tokenizers`' decode (invalid UTF-8 becomes U+FFFD)."""
        special = self._special if skip_special_tokens else frozenset()
        raw = b"".join(self.token_bytes(i) for i in ids if i not in special)
        return raw.decode("utf-8", errors="replace")

    def token_bytes(self, i: int) -> bytes:
        """The exact bytes token `i` stands for (ByteLevel decoding; other tokens: their UTF-8)."""
        b = self._bytes_cache.get(i)
        if b is None:
            s = self.spec.token_of(i) if type(i) is int else None
            if s is None:
                raise TokenizerError(f"token id {i!r} is not in the vocabulary ({self.vocab_size} tokens)")
            b = self._bytes_cache[i] = byte_level_bytes(s)
        return b

    def stream_decode(self, ids: Iterable[int]) -> Iterator[str]:
        """Text as soon as it forms whole UTF-8 characters; never a broken character."""
        return stream_text(ids, self.token_bytes)


def _native_tokenizer(d: Path, spec: TokenizerSpec) -> Any:
    """A `tokenizers.Tokenizer` for a checked spec: tokenizer.json read by `tokenizers` itself;
    vocab.json + merges.txt built from the checked spec (one parse of merges.txt for both paths)."""
    import tokenizers

    if not (d / "tokenizer.json").is_file():
        return _native_from_spec(spec)
    try:
        return tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception
        raise TokenizerError(f"tokenizer files in {d} could not be read by tokenizers: {e}") from e


def _native_from_spec(spec: TokenizerSpec) -> Any:
    """A `tokenizers.Tokenizer` built from a checked vocabulary + merges (vocab.json + merges.txt,
    or a GGUF file's metadata): GPT-2's ByteLevel pre-tokenizer and decoder, added tokens literal."""
    import tokenizers

    try:
        tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=dict(spec.vocab), merges=list(spec.merges)))
        tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tokenizers.decoders.ByteLevel()
        tok.add_special_tokens([tokenizers.AddedToken(t.content, special=True, normalized=False)
                                for t in spec.added_tokens if t.special])
        tok.add_tokens([tokenizers.AddedToken(t.content, special=False, normalized=False)
                        for t in spec.added_tokens if not t.special])
        return tok
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception
        raise TokenizerError(f"{spec.source}: the tokenizer could not be built by tokenizers: {e}") from e


def _have_tokenizers() -> bool:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


def stream_text(ids: Iterable[int], token_bytes: Callable[[int], bytes]) -> Iterator[str]:
    """Decode token ids incrementally: yield text whenever the bytes so far end on a whole UTF-8
    character (a character split over byte-level tokens comes out whole, never as U+FFFD)."""
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for i in ids:
        piece = dec.decode(token_bytes(i))
        if piece:
            yield piece
    tail = dec.decode(b"", final=True)
    if tail:
        yield tail
