"""The tokenizer of every byte-level BPE family webtensor runs (GPT-2, Llama 3.x, Qwen2/2.5/3, SmolLM2).

`Tokenizer` reads a checkpoint directory (tokenizer.json, or vocab.json + merges.txt, with
tokenizer_config.json's named special tokens) or a GGUF file's `tokenizer.ggml.*` metadata. Both are
read and checked once by `tokenizer_files` (the same checker the page uses), then encoded by Hugging
Face `tokenizers` where it is installed, else (the browser) by the pure-Python `bpe` module, which
gives the same ids. Decoding is the same code on both paths (the ByteLevel decoder's rule over the
checked vocabulary) and, by default, leaves special tokens out of the text, as transformers'
`decode(..., skip_special_tokens=True)` does. `token_bytes` lets a streamer emit only whole UTF-8
characters."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import TokenizerError
from .bpe import ByteLevelBPE, byte_level_bytes
from .pretok import ByteLevelStep, DigitsSplit, RegexSplit
from .tokenizer_files import AddedToken, TokenizerSpec, parse_gguf_tokenizer, read_tokenizer_dir, with_named_tokens


class Tokenizer:
    """A byte-level BPE tokenizer, encoding with `tokenizers` (kind "tokenizers") or the pure-Python
    BPE (kind "pure-python"); both give the same ids.

    Attributes: `vocab_size` (embedding rows the ids need), `bos_token_id` / `eos_token_id` /
    `pad_token_id` / `unk_token_id` (None where the tokenizer names none), `special_ids` (the special
    tokens' ids: skipped when decoding for display), `add_bos_token` (encode(add_special_tokens=True)
    puts the BOS first, as Llama 3's post-processor does), `spec` (the checked description)."""

    def __init__(self, backend: Any, kind: str, spec: TokenizerSpec):
        self._tok, self.kind, self.spec = backend, kind, spec
        self.vocab_size = spec.vocab_size
        named = spec.named
        self.bos_token_id: int | None = named.get("bos_token")
        self.eos_token_id: int | None = named.get("eos_token")
        self.pad_token_id: int | None = named.get("pad_token")
        self.unk_token_id: int | None = named.get("unk_token")
        self.special_ids: frozenset[int] = spec.special_ids
        self.add_bos_token = bool(spec.prefix_ids) and spec.prefix_ids[0] == self.bos_token_id
        self._added_ids = {t.content: t.id for t in spec.added_tokens}
        self._bytes_cache: dict[int, bytes] = {}

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, d: str | Path, *, native: bool | None = None) -> Tokenizer:
        """Read the tokenizer of checkpoint directory `d`. `native`: use `tokenizers` (None: where
        installed). Files outside what `tokenizer_files` accepts raise a TokenizerError (a
        CheckpointError) naming the field, on both paths alike."""
        spec = read_tokenizer_dir(d)
        if not (_have_tokenizers() if native is None else native):
            return cls(ByteLevelBPE.from_spec(spec), "pure-python", spec)
        return cls(_native_tokenizer(Path(d), spec), "tokenizers", spec)

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], source: str = "GGUF metadata", *,
                           native: bool | None = None) -> Tokenizer:
        """The tokenizer a GGUF file's metadata describes (`tokenizer.ggml.model` "gpt2", with
        llama.cpp's meaning of `tokenizer.ggml.pre`: see `tokenizer_files.GGUF_PRE_TOKENIZERS`).
        Another model (SentencePiece "llama", WordPiece "bert"), an unknown `pre` or a malformed
        field raises a TokenizerError naming it."""
        return cls._from_spec(parse_gguf_tokenizer(meta, source), native)

    @classmethod
    def from_vocab(cls, tokens: Sequence[str], merges: Sequence[tuple[str, str]], special: Iterable[int] = (),
                   added: Iterable[int] = (), source: str = "vocabulary", *,
                   eos_token_id: int | None = None) -> Tokenizer:
        """A GPT-2-style byte-level BPE from memory: `tokens` in id order, in byte-level spelling
        ("Ġthe"), `merges` in rank order; ids in `special` are special added tokens
        (<|endoftext|>), ids in `added` ordinary added tokens, both matched literally."""
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
        named = {"eos_token": tokens[eos_token_id]} if eos_token_id is not None else {}
        return cls._from_spec(with_named_tokens(spec, named, source=source), None)

    @classmethod
    def _from_spec(cls, spec: TokenizerSpec, native: bool | None) -> Tokenizer:
        if not (_have_tokenizers() if native is None else native):
            return cls(ByteLevelBPE.from_spec(spec), "pure-python", spec)
        return cls(_native_from_spec(spec), "tokenizers", spec)

    # -- vocabulary ------------------------------------------------------------------------------
    @property
    def bos_token(self) -> str | None:
        return self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else None

    @property
    def eos_token(self) -> str | None:
        return self.id_to_token(self.eos_token_id) if self.eos_token_id is not None else None

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens as text ({"bos_token": "<|im_start|>", ...}), as transformers
        passes them to a chat template."""
        return {name: self.spec.id_to_token[i] for name, i in self.spec.named.items()}

    def id_to_token(self, i: int) -> str | None:
        """The token string of id `i` (byte-level spelling, or an added token's text), or None."""
        return self.spec.token_of(i)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token (byte-level spelling, e.g. "Ġthe", or an added token's text), or None."""
        return self._added_ids.get(token, self.spec.vocab.get(token))

    def is_special(self, i: int) -> bool:
        return i in self.special_ids

    # -- encoding / decoding ---------------------------------------------------------------------
    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """The ids of `text`; special tokens written in it (<|im_start|>) are matched literally.
        `add_special_tokens`: wrap them as the tokenizer's post-processor does (a BOS for Llama 3),
        as transformers' `tokenizer(text)` does for a raw prompt; leave it False for a rendered chat
        template, which writes its own BOS."""
        if not isinstance(text, str):
            raise TokenizerError(f"the text to encode must be a str, got {type(text).__name__}")
        if self.kind == "tokenizers":  # (encode_batch releases the GIL, encode holds it: a server's
            # event loop goes on serving while another thread tokenizes a long prompt; the same ids)
            return list(self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)
        ids: list[int] = self._tok.encode(text, add_special_tokens=add_special_tokens)  # (ByteLevelBPE's)
        return ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Text for `ids` like `tokenizers`' decode (invalid UTF-8 becomes U+FFFD). Special tokens
        are left out unless `skip_special_tokens=False`."""
        raw = b"".join(self.token_bytes(i, skip_special_tokens=skip_special_tokens) for i in ids)
        return raw.decode("utf-8", errors="replace")

    def token_bytes(self, i: int, *, skip_special_tokens: bool = True) -> bytes:
        """The exact bytes token `i` stands for (ByteLevel decoding; other tokens: their UTF-8);
        b"" for a special token unless `skip_special_tokens=False`."""
        b = self._bytes_cache.get(i)
        if b is None:
            s = self.spec.token_of(i) if type(i) is int else None
            if s is None:
                raise TokenizerError(f"token id {i!r} is not in the vocabulary ({self.vocab_size} tokens)")
            b = self._bytes_cache[i] = byte_level_bytes(s)
        return b"" if skip_special_tokens and i in self.special_ids else b

    def stream_decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> Iterator[str]:
        """Text as soon as it forms whole UTF-8 characters; never a broken character."""
        return stream_text(ids, lambda i: self.token_bytes(i, skip_special_tokens=skip_special_tokens))

    def __repr__(self) -> str:
        return f"Tokenizer({self.spec.source!r}, {self.vocab_size} tokens, {self.kind})"


GPT2Tokenizer = Tokenizer  # the name before the Llama family: old imports keep working


def _native_tokenizer(d: Path, spec: TokenizerSpec) -> Any:
    """A `tokenizers.Tokenizer` for a checked spec: tokenizer.json read by `tokenizers` itself (plus
    the named special tokens tokenizer_config.json adds, as transformers adds them); vocab.json +
    merges.txt built from the checked spec (one parse of merges.txt for both paths)."""
    import tokenizers

    if not (d / "tokenizer.json").is_file():
        return _native_from_spec(spec)
    try:
        tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
        have = set(tok.get_added_tokens_decoder())
        tok.add_special_tokens([tokenizers.AddedToken(t.content, special=True, normalized=False)
                                for t in spec.added_tokens if t.id not in have])
        return tok
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception
        raise TokenizerError(f"tokenizer files in {d} could not be read by tokenizers: {e}") from e


def _native_from_spec(spec: TokenizerSpec) -> Any:
    """A `tokenizers.Tokenizer` built from a checked spec (vocab.json + merges.txt, or a GGUF file's
    metadata): its pre-tokenizer steps, normalizers, BOS / EOS template, ByteLevel decoder."""
    import tokenizers
    from tokenizers import Regex, normalizers, pre_tokenizers, processors

    def pre_step(step: Any) -> Any:
        if isinstance(step, RegexSplit):
            return pre_tokenizers.Split(Regex(step.pattern), behavior="isolated", invert=False)
        if isinstance(step, DigitsSplit):
            return pre_tokenizers.Digits(individual_digits=step.individual_digits)
        assert isinstance(step, ByteLevelStep)
        return pre_tokenizers.ByteLevel(add_prefix_space=step.add_prefix_space, use_regex=step.use_regex)

    try:
        tok = tokenizers.Tokenizer(tokenizers.models.BPE(
            vocab=dict(spec.vocab), merges=list(spec.merges), unk_token=spec.unk_token, fuse_unk=spec.fuse_unk,
            ignore_merges=spec.ignore_merges))
        steps = [pre_step(s) for s in spec.pre_steps]
        tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
        if spec.normalizers:
            tok.normalizer = normalizers.Sequence([getattr(normalizers, n)() for n in spec.normalizers])
        tok.decoder = tokenizers.decoders.ByteLevel()
        tok.add_special_tokens([tokenizers.AddedToken(t.content, special=True, normalized=False)
                                for t in spec.added_tokens if t.special])
        tok.add_tokens([tokenizers.AddedToken(t.content, special=False, normalized=False)
                        for t in spec.added_tokens if not t.special])
        if spec.prefix_ids or spec.suffix_ids:
            names = [f"s{k}" for k in range(len(spec.prefix_ids) + len(spec.suffix_ids))]
            ids = [*spec.prefix_ids, *spec.suffix_ids]
            single = [*names[:len(spec.prefix_ids)], "$A", *names[len(spec.prefix_ids):]]
            tok.post_processor = processors.TemplateProcessing(
                single=single, pair=[*single, "$B"],
                special_tokens=[{"id": n, "ids": [i], "tokens": [spec.id_to_token[i]]}
                                for n, i in zip(names, ids, strict=True)])
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
