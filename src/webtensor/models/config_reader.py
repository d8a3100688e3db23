"""Typed reads of a checkpoint's hyper-parameters, shared by every family's config parser and the loader.

- `read_json_object`: a JSON file holding one object (config.json, generation_config.json);
- `JSONConfig`: a config.json object's keys as int / float / bool, refusing a wrong type with one line naming
  the key;
- `GGUFMetadata`: the same reads of a GGUF file's `<arch>.<key>` metadata, and its vocabulary size;
- `token_id` / `token_ids`: a token id, or an id / a list of ids, or null.

Every refusal is a one-line CheckpointError naming the file (`where`), the key and the value. numpy-free (the
page reads checkpoints through this module too).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import CheckpointError

REQUIRED: Any = ...  # the default of a read that must find its key


def read_json_object(path: Path, missing: str | None) -> dict[str, Any]:
    """The JSON object in `path`; a missing file is refused with `{path} is missing: {missing}`, or read as {} when
    `missing` is None (an optional file)."""
    if not path.is_file():
        if missing is None:
            return {}
        raise CheckpointError(f"{path} is missing: {missing}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(raw).__name__}")
    return raw


class JSONConfig:
    """Typed reads of a config.json object's keys. A key absent reads as its default (REQUIRED: refused); a wrong
    type is refused. `null_as_default`: a null boolean reads as its default (else it is refused)."""

    def __init__(self, raw: Mapping[str, Any], where: str, null_as_default: bool = False):
        self.raw, self.where, self.null_as_default = raw, where, null_as_default

    def _get(self, key: str, default: Any) -> Any:
        v = self.raw.get(self._key(key), default)
        if v is REQUIRED:
            raise self._missing(key)
        return v

    def _key(self, key: str) -> str:
        return key

    def _missing(self, key: str) -> CheckpointError:
        return CheckpointError(f"{self.where} lacks required key {key}")

    def _wrong(self, key: str, kind: str, value: Any) -> CheckpointError:
        want = {"int": "an integer", "float": "a number", "bool": "true or false"}[kind]
        return CheckpointError(f"{self.where}: a hyper-parameter has the wrong type: {key} must be {want}, "
                               f"got {value!r}")

    def int(self, key: str, default: Any = REQUIRED) -> Any:
        """An integer (32.0, as some tools write it, is 32); null where the default is None reads as None."""
        v = self._get(key, default)
        if v is None and default is None:
            return None
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._wrong(key, "int", v)
        return v

    def float(self, key: str, default: Any = REQUIRED) -> float:
        v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self._wrong(key, "float", v)
        return float(v)

    def bool(self, key: str, default: bool) -> bool:
        v = self._get(key, default)
        if v is None and self.null_as_default:
            return default
        if not isinstance(v, bool):
            raise self._wrong(key, "bool", v)
        return v


class GGUFMetadata(JSONConfig):
    """Typed reads of a GGUF file's metadata keys under `<arch>.` (`m.int("block_count")` reads
    `llama.block_count`)."""

    def __init__(self, meta: Mapping[str, Any], arch: str, where: str):
        super().__init__(meta, where)
        self.arch = arch

    def _key(self, key: str) -> str:
        return f"{self.arch}.{key}"

    def _missing(self, key: str) -> CheckpointError:
        return CheckpointError(f"{self.where}: metadata key {self._key(key)!r} is missing")

    def _wrong(self, key: str, kind: str, value: Any) -> CheckpointError:
        return CheckpointError(f"{self.where}: metadata {self._key(key)!r} should be {kind}, got {value!r}")

    def vocab_size(self) -> int:
        """`<arch>.vocab_size`, or (llama.cpp's converter leaves it out) the number of `tokenizer.ggml.tokens`."""
        vocab = self.int("vocab_size", None)
        if vocab is None:
            tokens = self.raw.get("tokenizer.ggml.tokens")
            if not isinstance(tokens, list):
                raise CheckpointError(f"{self.where}: neither {self._key('vocab_size')} nor tokenizer.ggml.tokens "
                                      "gives the vocabulary size")
            vocab = len(tokens)
        return int(vocab)

    def token_id(self, key: str) -> int | None:
        """The token id at the (unprefixed) key `key`, e.g. `tokenizer.ggml.bos_token_id`, or None."""
        return token_id(self.raw.get(key), key, self.where)

    def token_ids(self, key: str) -> tuple[int, ...]:
        return token_ids(self.raw.get(key), key, self.where)


def token_id(v: Any, key: str, where: str) -> int | None:
    """`v` as a token id (an integer) or None (null)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise CheckpointError(f"{where}: {key} must be an integer token id or null, got {v!r}")
    return v


def token_ids(v: Any, key: str, where: str) -> tuple[int, ...]:
    """`v` (an id, a list of ids, or null) as a tuple of token ids."""
    if not isinstance(v, list):
        one = token_id(v, key, where)
        return () if one is None else (one,)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise CheckpointError(f"{where}: {key} must be a list of integer token ids, got {v!r}")
    return tuple(v)
