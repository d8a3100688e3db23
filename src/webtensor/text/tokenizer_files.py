"""Which byte-level BPE tokenizers webtensor reads: one checker for the page and the native path.

Three sources, each read into a checked :class:`TokenizerSpec` or refused with a
:class:`TokenizerFormatError` (a ``CheckpointError``) whose one line names the offending field:

* a checkpoint directory (:func:`read_tokenizer_dir`): ``tokenizer.json`` (preferred) or GPT-2's
  ``vocab.json`` + ``merges.txt``, plus ``tokenizer_config.json`` (or ``special_tokens_map.json``)
  for the named special tokens (bos / eos / unk / pad and the additional ones) as transformers
  reads them;
* a GGUF file's ``tokenizer.ggml.*`` metadata (:func:`parse_gguf_tokenizer`), with llama.cpp's
  meaning of each ``tokenizer.ggml.pre``.

The pure-Python BPE (the page) builds from the spec; the native path checks the same spec before it
hands the tokenizer to Hugging Face ``tokenizers``.  So both accept, and refuse, exactly the same
checkpoints.

Accepted in tokenizer.json (the byte-level BPEs of GPT-2, Llama 3.x, Qwen2/2.5/3 and SmolLM2):

* ``model``: ``BPE`` with merges as ``"a b"`` strings or ``[a, b]`` pairs; ``dropout`` null/0;
  ``continuing_subword_prefix`` / ``end_of_word_suffix`` null or ``""``; ``byte_fallback`` false;
  ``unk_token``, ``fuse_unk``, ``ignore_merges``.
* ``normalizer``: null, ``NFC``/``NFD``/``NFKC``/``NFKD``/``Lowercase`` or a ``Sequence`` of them.
* ``pre_tokenizer``: ``ByteLevel`` (any ``add_prefix_space``/``trim_offsets``/``use_regex``), alone
  or last in a ``Sequence`` after ``Split`` steps with GPT-2's, Llama 3's or Qwen2's regex
  (``Isolated``, not inverted) and ``Digits`` steps.
* ``post_processor``: null, ``ByteLevel``, ``TemplateProcessing`` (its ``single`` template: special
  tokens around one ``$A``) or a ``Sequence`` of these.
* ``decoder``: ``ByteLevel``.  ``truncation`` and ``padding``: null.
* ``added_tokens`` with ``special``/``lstrip``/``rstrip``/``normalized``/``single_word``.

Standard library only (it runs in Pyodide).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from os import PathLike
from pathlib import Path
from typing import Any

from ..errors import TokenizerError
from .pretok import (
    DEFAULT_PATTERNS,
    GPT2_PATTERN,
    LLAMA3_PATTERN,
    QWEN2_PATTERN,
    SPLIT_PATTERNS,
    ByteLevelStep,
    DigitsSplit,
    PreStep,
    RegexSplit,
)
from .unicode_norm import make_normalizer

__all__ = [
    "GGUF_PRE_TOKENIZERS",
    "GPT2_SPLIT_PATTERN",
    "NORMALIZERS",
    "AddedToken",
    "ByteLevelStep",
    "TokenizerFormatError",
    "TokenizerSpec",
    "gguf_tokenizer_metadata",
    "parse_gguf_tokenizer",
    "parse_tokenizer_json",
    "read_tokenizer_dir",
    "read_tokenizer_json",
    "read_vocab_merges",
]

StrPath = str | PathLike[str]

ENDOFTEXT = "<|endoftext|>"

# GPT-2's pre-tokenization regex as `tokenizers` spells it (ByteLevel's own, or a Split step's).
GPT2_SPLIT_PATTERN = GPT2_PATTERN

# The special tokens a tokenizer names, as transformers calls them (and passes to chat templates).
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")

# Normalizers the pure-Python tokenizer reproduces exactly (see `unicode_norm`).
NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD", "Lowercase")


class TokenizerFormatError(TokenizerError):
    """A tokenizer file (tokenizer.json, vocab.json, merges.txt) is malformed or unsupported."""


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


@dataclass(frozen=True)
class TokenizerSpec:
    """A checked byte-level BPE tokenizer description (construction validates it)."""

    vocab: Mapping[str, int]
    merges: Sequence[tuple[str, str]]
    added_tokens: Sequence[AddedToken] = ()
    normalizers: tuple[str, ...] = ()
    pre_steps: tuple[PreStep, ...] = (ByteLevelStep(),)
    # The post-processor's single template flattened: ids before and after the text.
    prefix_ids: tuple[int, ...] = ()
    suffix_ids: tuple[int, ...] = ()
    unk_token: str | None = None
    fuse_unk: bool = False
    ignore_merges: bool = False
    source: str = "tokenizer"
    # The named special tokens (NAMED_TOKENS: bos_token, eos_token, unk_token, pad_token) by id.
    named: Mapping[str, int] = field(default_factory=dict)
    # id -> token as tokenizers' id_to_token spells it (normalized added tokens normalized).
    id_to_token: dict[int, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        id_to_token = _check_model(self)
        if self.normalizers:  # tokenizers spells a normalized added token normalized (decode too)
            norm = make_normalizer(self.normalizers)
            for tok in self.added_tokens:
                if tok.normalized:
                    id_to_token[tok.id] = norm(tok.content)
        object.__setattr__(self, "id_to_token", id_to_token)

    @property
    def vocab_size(self) -> int:
        """Embedding rows the ids need: the largest id (vocabulary or added token) + 1."""
        return max([-1, *self.id_to_token]) + 1

    def token_of(self, idx: int) -> str | None:
        """Token string (added token content or vocabulary entry) for an id, or ``None``."""
        return self.id_to_token.get(idx)

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(t.id for t in self.added_tokens if t.special)


def _fail(source: str, msg: str) -> TokenizerFormatError:
    return TokenizerFormatError(f"{source}: {msg}")


def _check_model(spec: TokenizerSpec) -> dict[int, str]:
    """Validate vocabulary, merges, added tokens and template ids; return id -> token."""
    src = spec.source
    id_to_token: dict[int, str] = {}
    for token, idx in spec.vocab.items():
        if not isinstance(token, str) or type(idx) is not int or idx < 0:
            raise _fail(src, f"model.vocab: entry {token!r}: {idx!r} must map a string to a non-negative int")
        if idx in id_to_token:
            raise _fail(src, f"model.vocab: id {idx} is used by both {id_to_token[idx]!r} and {token!r}")
        id_to_token[idx] = token
    vocab = spec.vocab
    for rank, pair in enumerate(spec.merges):
        if len(pair) != 2 or not all(isinstance(p, str) for p in pair):
            raise _fail(src, f"model.merges: merge #{rank} must have exactly two string parts, got {pair!r}")
        left, right = pair
        for part in pair:
            if part not in vocab:
                raise _fail(src, f"model.merges: merge #{rank} {left!r} + {right!r}: token {part!r} "
                            "is not in the vocabulary")
        if left + right not in vocab:
            raise _fail(src, f"model.merges: merge #{rank} {left!r} + {right!r}: result {left + right!r} "
                        "is not in the vocabulary")
    if spec.unk_token is not None and spec.unk_token not in vocab:
        raise _fail(src, f"model.unk_token: {spec.unk_token!r} is not in the vocabulary")
    seen: dict[str, int] = {}
    for tok in spec.added_tokens:
        where = f"added_tokens: {tok.content!r}"
        if type(tok.id) is not int or tok.id < 0:
            raise _fail(src, f"{where} has an invalid id {tok.id!r}")
        if not tok.content:
            raise _fail(src, f"added_tokens: token {tok.id} has an empty 'content'")
        if tok.content in vocab and vocab[tok.content] != tok.id:
            raise _fail(src, f"{where} has id {tok.id} but the vocabulary says {vocab[tok.content]}")
        if seen.get(tok.content, tok.id) != tok.id:
            raise _fail(src, f"{where} is listed with two ids, {seen[tok.content]} and {tok.id}")
        other = id_to_token.get(tok.id)
        if other is not None and other != tok.content:
            raise _fail(src, f"{where} reuses id {tok.id} of token {other!r}")
        seen[tok.content] = tok.id
        id_to_token[tok.id] = tok.content
    for idx in (*spec.prefix_ids, *spec.suffix_ids):
        if idx not in id_to_token:
            raise _fail(src, f"post_processor: special token id {idx} is not in the vocabulary")
    for name, idx in spec.named.items():
        if name not in NAMED_TOKENS or idx not in id_to_token:
            raise _fail(src, f"{name} = {idx!r}: not a named special token in the vocabulary")
    for name in spec.normalizers:
        if name not in NORMALIZERS:
            raise _fail(src, f"normalizer {name!r} is not supported (need one of {', '.join(NORMALIZERS)})")
    return id_to_token


# ---------------------------------------------------------------------------------------------
# tokenizer.json
# ---------------------------------------------------------------------------------------------

_TOP_KEYS = {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
             "post_processor", "decoder", "model"}
_BPE_KEYS = {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
             "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"}
_BYTE_LEVEL_KEYS = {"type", "add_prefix_space", "trim_offsets", "use_regex"}
_ADDED_KEYS = {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}


class _Reader:
    """Field-by-field access to a tokenizer.json document with errors that name the field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, msg: str) -> TokenizerFormatError:
        return _fail(self.source, msg)

    def obj(self, value: Any, where: str, keys: set[str] | None) -> dict[str, Any]:
        """A JSON object whose fields are all in `keys` (None: any fields, checked later by type)."""
        if not isinstance(value, dict):
            raise self.fail(f"{where} must be a JSON object, got {value!r:.60}")
        unknown = sorted(set(value) - keys) if keys is not None else []
        if unknown:
            raise self.fail(f"{where}.{unknown[0]} is not a field webtensor knows (refused, not ignored)")
        return value

    def flag(self, d: dict[str, Any], key: str, where: str, default: bool | None = None) -> bool:
        """A boolean field; ``default=None``: required (``tokenizers`` refuses the file without it)."""
        if key not in d and default is None:
            raise self.fail(f"{where}.{key} is missing")
        value = d.get(key, default)
        if type(value) is not bool:
            raise self.fail(f"{where}.{key} must be true or false, got {value!r}")
        return value

    def typed(self, d: dict[str, Any], where: str) -> str:
        kind = d.get("type")
        if not isinstance(kind, str):
            raise self.fail(f"{where}.type must be a string, got {kind!r}")
        return kind

    def parse(self, data: Any) -> TokenizerSpec:
        top = self.obj(data, "top level", _TOP_KEYS)
        for key in ("truncation", "padding"):
            if top.get(key) is not None:
                raise self.fail(f"{key} is not supported (must be null): webtensor encodes whole prompts")
        if "model" not in top:
            raise self.fail("missing 'model' object")
        model = self.model(top["model"])
        added = self.added_tokens(top.get("added_tokens"))
        normalizers = self.normalizer(top.get("normalizer"), "normalizer")
        pre_steps = self.pre_tokenizer(top.get("pre_tokenizer"))
        prefix, suffix = self.post_processor(top.get("post_processor"), "post_processor")
        self.decoder(top.get("decoder"))
        return TokenizerSpec(added_tokens=added, normalizers=normalizers, pre_steps=pre_steps,
                             prefix_ids=prefix, suffix_ids=suffix, source=self.source, **model)

    def model(self, value: Any) -> dict[str, Any]:
        m = self.obj(value, "model", None)
        if m.get("type", "BPE") != "BPE":
            raise self.fail(f"model type {m.get('type')!r} is not supported (need 'BPE': a byte-level BPE)")
        self.obj(m, "model", _BPE_KEYS)
        vocab = m.get("vocab")
        if not isinstance(vocab, dict):
            raise self.fail("model.vocab must be an object mapping token -> id")
        if "merges" not in m:
            raise self.fail("model.merges is missing")
        raw = m["merges"]
        if not isinstance(raw, list):
            raise self.fail("model.merges must be a list")
        merges: list[tuple[str, str]] = []
        for i, item in enumerate(raw):
            parts = item.split(" ") if isinstance(item, str) else item
            if not isinstance(parts, list) or len(parts) != 2 or not all(isinstance(p, str) for p in parts):
                raise self.fail(f"model.merges: merge #{i} must have exactly two string parts "
                                f"('a b' or [a, b]), got {item!r}")
            merges.append((parts[0], parts[1]))
        for key in ("continuing_subword_prefix", "end_of_word_suffix"):
            if m.get(key) not in (None, ""):
                raise self.fail(f"model.{key} = {m[key]!r} is not supported (need null or '')")
        if self.flag(m, "byte_fallback", "model", False):
            raise self.fail("model.byte_fallback is not supported (need false)")
        dropout = m.get("dropout")
        if dropout is not None and (type(dropout) not in (int, float) or dropout != 0):
            raise self.fail(f"model.dropout = {dropout!r} is not supported (need null: encoding must be "
                            "deterministic)")
        unk = m.get("unk_token")
        if unk is not None and not isinstance(unk, str):
            raise self.fail(f"model.unk_token must be a string or null, got {unk!r}")
        return dict(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=self.flag(m, "fuse_unk", "model", False),
                    ignore_merges=self.flag(m, "ignore_merges", "model", False))

    def added_tokens(self, value: Any) -> list[AddedToken]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail("added_tokens must be a list")
        out = []
        for i, entry in enumerate(value):
            where = f"added_tokens[{i}]"
            e = self.obj(entry, where, _ADDED_KEYS)
            if not isinstance(e.get("content"), str):
                raise self.fail(f"{where} needs a string 'content'")
            if type(e.get("id")) is not int:
                raise self.fail(f"{where} ({e['content']!r}) needs an integer 'id'")
            out.append(AddedToken(content=e["content"], id=e["id"], special=self.flag(e, "special", where),
                                  single_word=self.flag(e, "single_word", where),
                                  lstrip=self.flag(e, "lstrip", where), rstrip=self.flag(e, "rstrip", where),
                                  normalized=self.flag(e, "normalized", where)))
        return out

    def normalizer(self, value: Any, where: str) -> tuple[str, ...]:
        if value is None:
            return ()
        d = self.obj(value, where, None)
        kind = self.typed(d, where)
        if kind in NORMALIZERS:
            self.obj(d, where, {"type"})
        if kind == "Sequence":
            self.obj(d, where, {"type", "normalizers"})
            items = d.get("normalizers")
            if not isinstance(items, list):
                raise self.fail(f"{where}.normalizers must be a list")
            return tuple(n for i, item in enumerate(items) for n in self.normalizer(item, f"{where}.normalizers[{i}]"))
        if kind not in NORMALIZERS:
            raise self.fail(f"{where} {kind!r} is not supported (need null, {', '.join(NORMALIZERS)} "
                            "or a Sequence of them)")
        return (kind,)

    def pre_tokenizer(self, value: Any) -> tuple[PreStep, ...]:
        where = "pre_tokenizer"
        if value is None:
            raise self.fail("pre_tokenizer is null (need ByteLevel: this is not a byte-level BPE)")
        d = self.obj(value, where, None)
        items: list[Any] = [d]
        if self.typed(d, where) == "Sequence":
            self.obj(d, where, {"type", "pretokenizers"})
            listed = d.get("pretokenizers")
            if not isinstance(listed, list):
                raise self.fail(f"{where}.pretokenizers must be a list")
            items = listed
            where = f"{where}.pretokenizers"
        steps: list[PreStep] = []
        for i, item in enumerate(items):
            at = f"{where}[{i}]" if where.endswith("pretokenizers") else where
            kind = self.typed(self.obj(item, at, None), at)
            if steps and isinstance(steps[-1], ByteLevelStep):
                raise self.fail(f"{at}: {kind!r} after ByteLevel is not supported (ByteLevel must come last)")
            if kind == "ByteLevel":
                b = self.obj(item, at, _BYTE_LEVEL_KEYS)
                self.flag(b, "trim_offsets", at)  # offsets only: no effect on ids
                steps.append(ByteLevelStep(self.flag(b, "add_prefix_space", at), self.flag(b, "use_regex", at, True)))
            elif kind == "Split":
                steps.append(self.split(self.obj(item, at, {"type", "pattern", "behavior", "invert"}), at))
            elif kind == "Digits":
                steps.append(DigitsSplit(self.flag(self.obj(item, at, {"type", "individual_digits"}),
                                                   "individual_digits", at)))
            else:
                raise self.fail(f"{at} {kind!r} is not supported (need ByteLevel, optionally after Split and "
                                "Digits steps, in a Sequence)")
        if not steps or not isinstance(steps[-1], ByteLevelStep):
            raise self.fail(f"{where} has no ByteLevel step (need ByteLevel: this is not a byte-level BPE)")
        return tuple(steps)

    def split(self, d: dict[str, Any], at: str) -> RegexSplit:
        pattern = d.get("pattern")
        regex = pattern.get("Regex") if isinstance(pattern, dict) and len(pattern) == 1 else None
        if not isinstance(regex, str) or regex not in SPLIT_PATTERNS.values():
            raise self.fail(f"{at}.pattern {pattern!r:.80} is not supported (need the regex of "
                            f"{', '.join(SPLIT_PATTERNS)})")
        if d.get("behavior") != "Isolated":
            raise self.fail(f"{at}.behavior {d.get('behavior')!r} is not supported (need 'Isolated')")
        if self.flag(d, "invert", at):
            raise self.fail(f"{at}.invert is not supported (need false)")
        return RegexSplit(regex)

    def post_processor(self, value: Any, where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ids a processor (chain) puts before and after the text."""
        if value is None:
            return (), ()
        d = self.obj(value, where, None)
        kind = self.typed(d, where)
        if kind == "ByteLevel":  # trims offsets only
            self.byte_level_flags(self.obj(d, where, _BYTE_LEVEL_KEYS), where)
            return (), ()
        if kind == "Sequence":
            items = self.obj(d, where, {"type", "processors"}).get("processors")
            if not isinstance(items, list):
                raise self.fail(f"{where}.processors must be a list")
            prefix: tuple[int, ...] = ()
            suffix: tuple[int, ...] = ()
            for i, item in enumerate(items):  # each one wraps what the ones before it produced
                p, s = self.post_processor(item, f"{where}.processors[{i}]")
                prefix, suffix = p + prefix, suffix + s
            return prefix, suffix
        if kind == "TemplateProcessing":
            return self.template(self.obj(d, where, {"type", "single", "pair", "special_tokens"}), where)
        raise self.fail(f"{where} {kind!r} is not supported (need null, ByteLevel, TemplateProcessing or a "
                        "Sequence of them)")

    def template(self, d: dict[str, Any], where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        for key in ("single", "pair", "special_tokens"):
            if key not in d:
                raise self.fail(f"{where}.{key} is missing")
        specials = d["special_tokens"]
        if not isinstance(specials, dict):
            raise self.fail(f"{where}.special_tokens must be an object")
        single = d.get("single")
        if not isinstance(single, list):
            raise self.fail(f"{where}.single must be a list of template pieces")
        if not isinstance(d["pair"], list):
            raise self.fail(f"{where}.pair must be a list of template pieces")
        before: list[int] = []
        after: list[int] | None = None
        for i, piece in enumerate(single):
            at = f"{where}.single[{i}]"
            if not isinstance(piece, dict) or len(piece) != 1:
                raise self.fail(f"{at} must be {{'Sequence': ...}} or {{'SpecialToken': ...}}, got {piece!r:.60}")
            (kind, body), = piece.items()
            name = body.get("id") if isinstance(body, dict) else None
            if kind == "Sequence" and name == "A" and after is None:
                after = []
            elif kind == "SpecialToken" and isinstance(name, str):
                entry = specials.get(name)
                ids = entry.get("ids") if isinstance(entry, dict) else None
                if not isinstance(ids, list) or not all(type(x) is int for x in ids):
                    raise self.fail(f"{at}: special token {name!r} has no 'ids' list in {where}.special_tokens")
                (before if after is None else after).extend(ids)
            else:
                raise self.fail(f"{at} {piece!r:.60} is not supported (need special tokens around one $A)")
        if after is None:
            raise self.fail(f"{where}.single has no $A (the text) piece")
        return tuple(before), tuple(after)

    def decoder(self, value: Any) -> None:
        if value is None:
            raise self.fail("decoder is null (need ByteLevel: this is not a byte-level BPE)")
        d = self.obj(value, "decoder", None)
        if self.typed(d, "decoder") != "ByteLevel":
            raise self.fail(f"decoder {d['type']!r} is not supported (need ByteLevel)")
        self.obj(d, "decoder", _BYTE_LEVEL_KEYS)
        self.byte_level_flags(d, "decoder")

    def byte_level_flags(self, d: dict[str, Any], where: str) -> None:
        """Check a ByteLevel post-processor's or decoder's flags (they change offsets, not ids or text)."""
        self.flag(d, "add_prefix_space", where)
        self.flag(d, "trim_offsets", where)
        self.flag(d, "use_regex", where, True)


def parse_tokenizer_json(data: Any, *, source: str = "tokenizer.json") -> TokenizerSpec:
    """Check a parsed tokenizer.json document and describe it (see the module docstring)."""
    return _Reader(source).parse(data)


def read_tokenizer_json(path: StrPath) -> TokenizerSpec:
    """Read and check a Hugging Face ``tokenizer.json``."""
    return parse_tokenizer_json(_load_json(path), source=str(path))


def read_vocab_merges(vocab_json: StrPath, merges_txt: StrPath, *,
                      special_tokens: Iterable[str] = (ENDOFTEXT,)) -> TokenizerSpec:
    """Read and check the classic ``vocab.json`` + ``merges.txt`` pair.

    ``merges.txt``: one ``left right`` pair per line; a first line starting with ``#version`` and
    empty lines are skipped.  Those of ``special_tokens`` that the vocabulary holds (GPT-2:
    ``<|endoftext|>``) become special added tokens, matched literally in the text.
    """
    vocab = _load_json(vocab_json)
    if not isinstance(vocab, dict):
        raise _fail(str(vocab_json), "expected a JSON object mapping token -> id")
    try:
        text = Path(merges_txt).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise _fail(str(merges_txt), f"not valid UTF-8: {e}") from None
    merges: list[tuple[str, str]] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if (lineno == 1 and line.startswith("#version")) or not line:
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise _fail(f"{merges_txt}:{lineno}", f"expected 'left right', got {line!r}")
        merges.append((parts[0], parts[1]))
    added = [AddedToken(t, vocab[t], special=True) for t in special_tokens if t in vocab]
    return TokenizerSpec(vocab, merges, added, source=f"{vocab_json} + {merges_txt}")


def read_tokenizer_dir(path: StrPath) -> TokenizerSpec:
    """Read and check the tokenizer of a checkpoint directory: ``tokenizer.json`` (preferred) or
    ``vocab.json`` + ``merges.txt``, with the named special tokens of ``tokenizer_config.json``."""
    d = Path(path)
    if (d / "tokenizer.json").is_file():
        return with_named_tokens(read_tokenizer_json(d / "tokenizer.json"), *read_named_tokens(d))
    if not ((d / "vocab.json").is_file() and (d / "merges.txt").is_file()):
        raise TokenizerError(f"{d} has no tokenizer: it needs tokenizer.json, or vocab.json and merges.txt")
    spec = with_named_tokens(read_vocab_merges(d / "vocab.json", d / "merges.txt"), *read_named_tokens(d))
    # Without a tokenizer.json (and its post-processor), tokenizer_config.json's add_bos_token /
    # add_eos_token say what wraps the text, as transformers builds the template from them.
    config = _load_json(d / "tokenizer_config.json") if (d / "tokenizer_config.json").is_file() else {}
    wrap = {}
    for which in ("bos", "eos"):
        flag = config.get(f"add_{which}_token", False) if isinstance(config, dict) else False
        if type(flag) is not bool:
            raise _fail(str(d / "tokenizer_config.json"), f"add_{which}_token must be true or false, got {flag!r}")
        idx = spec.named.get(f"{which}_token")
        wrap[which] = (idx,) if flag and idx is not None else ()
    return replace(spec, prefix_ids=wrap["bos"], suffix_ids=wrap["eos"])


def _token_content(value: Any, where: str, source: str) -> str | None:
    """A special token as tokenizer_config.json spells it: a string, an AddedToken object or null."""
    if value is None or isinstance(value, str):
        return value
    content = value.get("content") if isinstance(value, dict) else None
    if isinstance(content, str):
        return content
    raise _fail(source, f"{where} must be a string, an object with a 'content' string, or null; got {value!r:.60}")


def read_named_tokens(path: StrPath) -> tuple[dict[str, str], list[str], str]:
    """The named special tokens of a checkpoint directory as transformers reads them:
    ``tokenizer_config.json``'s ``bos_token`` / ``eos_token`` / ``unk_token`` / ``pad_token`` (else
    ``special_tokens_map.json``'s), its additional special tokens, and the file they came from."""
    d = Path(path)
    named: dict[str, str] = {}
    extra: list[str] = []
    sources = []
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        f = d / name
        if not f.is_file():
            continue
        data = _load_json(f)
        if not isinstance(data, dict):
            raise _fail(str(f), "expected a JSON object")
        sources.append(str(f))
        for key in NAMED_TOKENS:
            content = _token_content(data.get(key), key, str(f))
            if content is not None:
                named.setdefault(key, content)
        for key in ("additional_special_tokens", "extra_special_tokens"):
            value = data.get(key)
            items = list(value.values()) if isinstance(value, dict) else value
            if items is None:
                continue
            if not isinstance(items, list):
                raise _fail(str(f), f"{key} must be a list of tokens")
            extra += [c for i, v in enumerate(items) if (c := _token_content(v, f"{key}[{i}]", str(f)))]
    return named, extra, " + ".join(sources) or str(d)


def with_named_tokens(spec: TokenizerSpec, named: Mapping[str, str], extra: Sequence[str] = (),
                      source: str = "tokenizer_config.json") -> TokenizerSpec:
    """`spec` with its named special tokens, as transformers sets them up: each named or additional
    special token in the vocabulary that is not an added token yet becomes a special one (matched
    literally, skipped when decoding).  A bos or eos token outside the vocabulary is refused; other
    named tokens outside it are left out (transformers would add rows the model does not have).
    Without a named eos, GPT-2's ``<|endoftext|>`` is the eos where it is a special token."""
    added = list(spec.added_tokens)
    ids = {t.content: t.id for t in added}
    for content in [*named.values(), *extra]:
        if content not in ids and content in spec.vocab:
            added.append(AddedToken(content, spec.vocab[content], special=True))
            ids[content] = spec.vocab[content]
    found: dict[str, int] = {}
    for key, content in named.items():
        if content in ids:
            found[key] = ids[content]
        elif key in ("bos_token", "eos_token"):
            raise _fail(source, f"{key} {content!r} is not in the vocabulary")
    if "eos_token" not in found and ENDOFTEXT in ids and any(t.special for t in added if t.content == ENDOFTEXT):
        found["eos_token"] = ids[ENDOFTEXT]
    return replace(spec, added_tokens=tuple(added), named=found)


# ---------------------------------------------------------------------------------------------
# GGUF metadata (tokenizer.ggml.*)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GGUFPre:
    """What llama.cpp's llama-vocab.cpp makes of one `tokenizer.ggml.pre` value."""

    steps: tuple[PreStep, ...]
    ignore_merges: bool = False
    add_bos: bool = False  # llama.cpp's default where the file has no tokenizer.ggml.add_bos_token


_SPLIT_THEN_BYTES = ByteLevelStep(use_regex=False)
_LLAMA3 = GGUFPre((RegexSplit(LLAMA3_PATTERN), _SPLIT_THEN_BYTES), ignore_merges=True, add_bos=True)
_QWEN2 = GGUFPre((RegexSplit(QWEN2_PATTERN), _SPLIT_THEN_BYTES))
GGUF_PRE_TOKENIZERS: dict[str, GGUFPre] = {
    # LLAMA_VOCAB_PRE_TYPE_GPT2: GPT-2's regex (ByteLevel's own).
    "gpt-2": GGUFPre((ByteLevelStep(),)),
    # LLAMA_VOCAB_PRE_TYPE_DEFAULT (also a file without the key): four isolating splits.
    "default": GGUFPre((*(RegexSplit(p) for p in DEFAULT_PATTERNS), _SPLIT_THEN_BYTES)),
    # LLAMA_VOCAB_PRE_TYPE_LLAMA3: Llama 3's regex; ignore_merges and a BOS, as its tokenizer.json.
    "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "llama-v3": _LLAMA3,
    # LLAMA_VOCAB_PRE_TYPE_QWEN2 (Qwen2, 2.5, 3 and the DeepSeek-R1 distills of Qwen).
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
    # LLAMA_VOCAB_PRE_TYPE_SMOLLM: every number on its own, then GPT-2's regex.
    "smollm": GGUFPre((DigitsSplit(individual_digits=True), ByteLevelStep())),
}
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5  # llama.cpp's token types
_GGUF_NAMED = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
               "pad_token": "padding_token_id"}


def parse_gguf_tokenizer(meta: Mapping[str, Any], source: str = "GGUF metadata") -> TokenizerSpec:
    """Check a GGUF file's ``tokenizer.ggml.*`` metadata and describe its byte-level BPE: the
    vocabulary (``tokens``, in id order, GPT-2 byte spelling), ``merges``, ``token_type`` (control
    tokens are special added tokens, user-defined ones plain added tokens), the bos / eos / unk /
    padding ids, ``add_bos_token`` / ``add_eos_token`` (llama.cpp's default for the pre-tokenizer
    where absent) and ``pre`` with llama.cpp's meaning (:data:`GGUF_PRE_TOKENIZERS`)."""

    def get(key: str, kind: type, default: Any = None) -> Any:
        value = meta.get(f"tokenizer.ggml.{key}", default)
        if value is not default and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise _fail(source, f"tokenizer.ggml.{key} must be {kind.__name__}, got {value!r:.60}")
        return value

    model = get("model", str)
    if model != "gpt2":
        kind = {"llama": "a SentencePiece vocabulary", "bert": "a WordPiece vocabulary",
                "t5": "a Unigram vocabulary"}.get(str(model), "not a byte-level BPE")
        raise _fail(source, f"tokenizer.ggml.model is {model!r} ({kind}); webtensor reads byte-level BPE "
                    "vocabularies ('gpt2') only")
    pre_name = get("pre", str, "default")
    pre = GGUF_PRE_TOKENIZERS.get(pre_name)
    if pre is None:
        raise _fail(source, f"tokenizer.ggml.pre {pre_name!r} is not supported (need one of "
                    f"{', '.join(sorted(GGUF_PRE_TOKENIZERS))})")
    tokens, merges, types = get("tokens", list), get("merges", list), get("token_type", list, [])
    if tokens is None or merges is None:
        raise _fail(source, f"tokenizer.ggml.{'tokens' if tokens is None else 'merges'} is missing")
    if not all(isinstance(t, str) for t in tokens):
        raise _fail(source, "tokenizer.ggml.tokens must be a list of strings")
    if types and (len(types) != len(tokens) or not all(type(t) is int for t in types)):
        raise _fail(source, f"tokenizer.ggml.token_type must be {len(tokens)} integers, one a token")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        dup = next(t for i, t in enumerate(tokens) if vocab[t] != i)
        raise _fail(source, f"tokenizer.ggml.tokens: token {dup!r} appears more than once")
    pairs = []
    for i, m in enumerate(merges):
        parts = m.split(" ") if isinstance(m, str) else []
        if len(parts) != 2:
            raise _fail(source, f"tokenizer.ggml.merges: merge #{i} {m!r:.60} is not 'left right'")
        pairs.append((parts[0], parts[1]))
    added = [AddedToken(tokens[i], i, special=t == TOKEN_CONTROL)
             for i, t in enumerate(types) if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]
    named = {}
    for name, key in _GGUF_NAMED.items():
        idx = get(key, int)
        if idx is not None:
            if not 0 <= idx < len(tokens):
                raise _fail(source, f"tokenizer.ggml.{key} = {idx} is outside the vocabulary of {len(tokens)}")
            named[name] = idx
    flags = {}
    for which, default in (("bos", pre.add_bos), ("eos", False)):
        flags[which] = get(f"add_{which}_token", bool, default)
        if flags[which] and f"{which}_token" not in named:
            raise _fail(source, f"tokenizer.ggml.add_{which}_token is true but tokenizer.ggml.{which}_token_id "
                        "is not set")
    return TokenizerSpec(vocab, pairs, added, pre_steps=pre.steps, ignore_merges=pre.ignore_merges,
                         prefix_ids=(named["bos_token"],) if flags["bos"] else (),
                         suffix_ids=(named["eos_token"],) if flags["eos"] else (),
                         source=source, named=named)


def _load_json(path: StrPath) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise _fail(str(path), f"invalid JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise _fail(str(path), f"not valid UTF-8: {e}") from None
    except OSError as e:
        raise _fail(str(path), f"cannot be read: {e.strerror or e}") from None


def gguf_tokenizer_metadata(spec: TokenizerSpec, vocab_size: int | None = None) -> dict[str, Any]:
    """The `tokenizer.ggml.*` metadata of `spec` as llama.cpp's converter writes it (the inverse of
    :func:`parse_gguf_tokenizer`): the vocabulary in id order, padded to `vocab_size` with ``[PAD{i}]``
    tokens (type unused), token types (control for special added tokens, user-defined for plain ones),
    merges, the pre-tokenizer's name, the named ids, add_bos_token / add_eos_token. A GGUF file carries no
    normalizer (llama.cpp applies none: Qwen's NFC is left out, as its converter leaves it out); a spec
    whose pre-tokenizer no `tokenizer.ggml.pre` names, or with a template other than BOS / EOS, is refused."""
    pre = next((name for name, p in GGUF_PRE_TOKENIZERS.items()
                if p.steps == tuple(spec.pre_steps) and p.ignore_merges == spec.ignore_merges), None)
    if pre is None:
        raise _fail(spec.source, "no tokenizer.ggml.pre names this pre-tokenizer (and ignore_merges)")
    if set(spec.normalizers) - {"NFC"}:
        raise _fail(spec.source, f"normalizer {', '.join(spec.normalizers)}: GGUF metadata carries none")
    named = dict(spec.named)
    bos, eos = named.get("bos_token"), named.get("eos_token")
    if spec.prefix_ids not in ((), (bos,)) or spec.suffix_ids not in ((), (eos,)):
        raise _fail(spec.source, "post_processor: only a BOS before and an EOS after the text fit in GGUF metadata")
    n = max(spec.vocab_size, vocab_size or 0)
    added = {t.id: t for t in spec.added_tokens}
    tokens, types = [], []
    for i in range(n):
        token = spec.token_of(i)
        tokens.append(token if token is not None else f"[PAD{i}]")
        types.append(TOKEN_UNUSED if token is None else TOKEN_NORMAL if i not in added else
                     TOKEN_CONTROL if added[i].special else TOKEN_USER_DEFINED)
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": [f"{a} {b}" for a, b in spec.merges],
        "tokenizer.ggml.add_bos_token": bool(spec.prefix_ids), "tokenizer.ggml.add_eos_token": bool(spec.suffix_ids),
    }
    for name, key in _GGUF_NAMED.items():
        if name in named:
            meta[f"tokenizer.ggml.{key}"] = named[name]
    return meta
