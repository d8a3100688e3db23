"""Structured output: OpenAI's `response_format` (json_object, json_schema) enforced by constrained decoding
through llguidance (Microsoft's low-level guidance library, the one vLLM, SGLang and llama.cpp also use).

- `compile_format(kind, schema)`: the request's format as an llguidance grammar (a JSON string): json_schema's
  schema, or `{"type": "object"}` for json_object; the JSON is compact (no free whitespace: llguidance's
  `whitespace_flexible: false`, so a model cannot wander in blanks), and the schema always enforced (OpenAI's
  `strict`). `check(grammar, tokenizer)`: GrammarError (one line) for what llguidance cannot compile — the
  server's 400.
- `grammar_tokenizer(tokenizer, vocab_size, eos_ids)`: llguidance's view of a webtensor tokenizer (every id's
  bytes, the special ids, the EOS ids), built once per tokenizer.
- `Constraint`: one sequence's matcher: `mask()` the allowed ids as a bit mask (int32 (ceil(V / 32),), bit i of
  word i // 32 for id i), `apply(logits)` those ids' logits kept and the others -inf, `consume(token)`. When the
  document is complete only the EOS ids are allowed: the sequence ends with finish "stop".

Why llguidance: an abi3 wheel with no Python dependencies (xgrammar's wheel requires torch, transformers and
triton; outlines-core builds a regex index over the vocabulary per schema), a mask in ~10-30 µs a token here
(tools/grammar_bench.py, BENCHMARKS.md). None of the three has a Pyodide wheel and Pyodide packages none of
them, so the page has no structured output; llguidance is imported only when a request asks for it.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import WebtensorError

if TYPE_CHECKING:  # (llguidance is imported only when a request asks for structured output)
    from llguidance._lib import JsonCompileOptions

JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


class GrammarError(WebtensorError, ValueError):
    """A response format that cannot be compiled to a grammar (the message says why)."""


def compile_format(kind: str, schema: dict[str, Any] | None) -> str:
    """The llguidance grammar of a response format: "json_object" (any JSON object) or "json_schema" (`schema`;
    None: any JSON object)."""
    import llguidance

    if kind not in ("json_object", "json_schema"):
        raise GrammarError(f"no grammar for response format {kind!r}")
    try:
        return str(llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema if schema is not None else {"type": "object"}), defaults=JSON_OPTIONS))
    except (ValueError, TypeError) as e:
        raise GrammarError(f"the JSON schema cannot be compiled: {e}") from None


def compile_lark(lark: str) -> str:
    """The llguidance grammar of a lark text (llguidance's own syntax: `%json {...}` schemas, `<[id]>` special
    tokens); compiled for a tokenizer by `check`."""
    import llguidance

    return str(llguidance.LLMatcher.grammar_from_lark(lark))


def check(grammar: str, tokenizer: Any) -> None:
    """GrammarError unless llguidance compiles `grammar` for `tokenizer` (an LLTokenizer)."""
    import llguidance

    err = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
    if err:
        raise GrammarError(f"the JSON schema cannot be compiled: {err.strip().splitlines()[0]}")


class _Wrapped:
    """What llguidance's TokenizerWrapper reads of a tokenizer: each id's bytes, the special ids, the EOS id, and
    encoding (of valid UTF-8 bytes)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Iterable[int]):
        self.eos_token_id = min(eos_ids)
        self.bos_token_id = None
        self.tokens = [_bytes(tokenizer, i) for i in range(vocab_size)]
        self.special_token_ids = [i for i in range(vocab_size) if _special(tokenizer, i)]
        self._tok = tokenizer

    def __call__(self, text: bytes | str) -> list[int]:
        s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        return list(self._tok.encode(s))


def _bytes(tokenizer: Any, i: int) -> bytes:
    try:
        return bytes(tokenizer.token_bytes(i, skip_special_tokens=False))
    except (TypeError, ValueError, KeyError, IndexError):
        return b""  # (an id past the tokenizer's: a padded embedding row)


def _special(tokenizer: Any, i: int) -> bool:
    is_special = getattr(tokenizer, "is_special", None)
    return bool(is_special(i)) if is_special is not None else False


_cache: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def grammar_tokenizer(tokenizer: Any, vocab_size: int, eos_ids: Iterable[int]) -> Any:
    """llguidance's LLTokenizer for `tokenizer` (built once per tokenizer object: ~V token lookups)."""
    import llguidance

    eos = sorted(eos_ids)
    with _lock:
        got = _cache.get(tokenizer)
        if got is None or got.vocab_size != vocab_size:
            got = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapped(tokenizer, vocab_size, eos)),
                                         n_vocab=vocab_size, eos_token=eos)
            _cache[tokenizer] = got
        return got


class Constraint:
    """One sequence's position in a grammar (see the module docstring)."""

    def __init__(self, tokenizer: Any, grammar: str, vocab_size: int):
        import llguidance

        self.matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        if self.matcher.is_error():
            raise GrammarError(f"the grammar cannot be followed: {self.matcher.get_error()}")

    def mask(self) -> Any:
        """The allowed next ids: int32 (ceil(V / 32),), bit i % 32 of word i // 32 set for id i."""
        out = np.empty((1, self.words), np.int32)
        self.matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        if self.matcher.is_error():
            raise GrammarError(f"the grammar failed: {self.matcher.get_error()}")
        return out[0]

    def apply(self, logits: Any, mask: Any | None = None) -> Any:
        """`logits` (V,) with every id the grammar does not allow now at -inf (a float32 copy)."""
        bits = unpack(self.mask() if mask is None else mask, self.vocab_size)
        return np.where(bits, np.asarray(logits, np.float32), np.float32(-np.inf))

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(int(token)):
            raise GrammarError(f"token {token} does not follow the grammar: {self.matcher.get_error()}")


def unpack(mask: Any, vocab_size: int) -> Any:
    """A bit mask (int32 words) as V booleans."""
    return np.unpackbits(np.ascontiguousarray(mask, np.int32).view(np.uint8), bitorder="little")[:vocab_size] \
        .astype(bool)
