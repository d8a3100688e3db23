"""The GPT-2 tokenizer: byte-level BPE through the `tokenizers` library, from tokenizer.json or
vocab.json + merges.txt. Where `tokenizers` is missing (the browser) the pure-Python `bpe` module
stands in; it gives the same ids. `token_bytes` lets a streamer emit only whole UTF-8 characters."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ...errors import TokenizerError
from .bpe import bytes_to_unicode

_BYTE_OF = {ch: b for b, ch in bytes_to_unicode().items()}


class GPT2Tokenizer:
    def __init__(self, backend: Any, kind: str):
        self._tok, self.kind = backend, kind  # kind: "tokenizers" or "pure-python"
        if kind == "tokenizers":
            self._special = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
            # ids the embedding must have rows for: the largest id + 1 (ids need not be dense)
            self.vocab_size = max(backend.get_vocab(with_added_tokens=True).values(), default=-1) + 1
            self.eos_token_id = backend.token_to_id("<|endoftext|>")
        else:
            self._special = {}
            self.vocab_size = backend.vocab_size
            self.eos_token_id = backend.eos_token_id
        self._bytes_cache: dict[int, bytes] = {}

    @classmethod
    def from_dir(cls, d: Path) -> GPT2Tokenizer:
        tj, vj, mt = d / "tokenizer.json", d / "vocab.json", d / "merges.txt"
        if not tj.is_file() and not (vj.is_file() and mt.is_file()):
            raise TokenizerError(f"{d} has no tokenizer: it needs tokenizer.json, or vocab.json and merges.txt")
        try:
            import tokenizers
        except ImportError:
            from .bpe import ByteLevelBPE

            try:
                return cls(ByteLevelBPE.from_dir(d), "pure-python")
            except Exception as e:
                raise TokenizerError(f"tokenizer files in {d} could not be read: {e}") from e
        try:
            if tj.is_file():
                tok = tokenizers.Tokenizer.from_file(str(tj))
            else:
                tok = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(str(vj), str(mt)))
                tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
                tok.decoder = tokenizers.decoders.ByteLevel()
                if tok.token_to_id("<|endoftext|>") is not None:
                    tok.add_special_tokens(["<|endoftext|>"])
        except Exception as e:
            raise TokenizerError(f"tokenizer files in {d} could not be read: {e}") from e
        return cls(tok, "tokenizers")

    def encode(self, text: str) -> list[int]:
        if self.kind == "tokenizers":
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        return self._tok.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self, i: int) -> bytes:
        """The exact bytes token `i` stands for (special tokens: their text in UTF-8)."""
        b = self._bytes_cache.get(i)
        if b is None:
            if self.kind != "tokenizers":
                b = self._tok.token_bytes(i)
            elif i in self._special:
                b = self._special[i].encode("utf-8")
            else:
                s = self._tok.id_to_token(i)
                if s is None:
                    raise TokenizerError(f"token id {i} is not in the vocabulary ({self.vocab_size} tokens)")
                # byte-level BPE spells each byte as one character; a vocabulary entry with other
                # characters (a hand-edited or foreign tokenizer) stands for their UTF-8 bytes
                b = b"".join(bytes((_BYTE_OF[c],)) if c in _BYTE_OF else c.encode("utf-8", "replace") for c in s)
            self._bytes_cache[i] = b
        return b

    def stream_decode(self, ids: Iterable[int]) -> Iterator[str]:
        """Text as soon as it forms whole UTF-8 characters; never a broken character."""
        return stream_text(ids, self.token_bytes)


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
