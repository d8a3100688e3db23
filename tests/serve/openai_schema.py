"""OpenAI's published response schemas (tests/data/openai-openapi: source, version and license
there) as JSON-schema validators: `check(name, obj)` raises jsonschema's ValidationError where `obj`
breaks schema `name` of components.schemas.

Read as JSON Schema 2020-12 (the document is OpenAPI 3.1), with two adjustments, both stated here:
- OpenAPI 3.0's `"nullable": true`, which the document still uses beside `anyOf [..., null]`, is
  read as admitting null too;
- strict (`strict=True`, the default): every object schema that lists its properties admits no
  others, so a field the spec does not name (a typo, a leaked extension) fails, except the
  extensions this server documents (`EXTENSIONS`). A schema made of parts (`allOf`: the Response is
  ModelResponseProperties, ResponseProperties and its own) is closed as a whole
  (`unevaluatedProperties: false`, which sees the properties of every part), its parts left open.
And one variant: `CreateCompletionResponse` streamed, whose choices' `finish_reason` is null until
the last chunk (as OpenAI streams it; the spec shares one shape for both and forgets the null).
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

DATA = Path(__file__).resolve().parents[1] / "data" / "openai-openapi" / "schemas.json"
EXTENSIONS = {"Model": {"max_model_len": {"type": "integer"}}}  # vLLM's, documented in protocol.py


def _adjust(node: Any, strict: bool, part: bool = False) -> Any:
    """`part`: the node is one part of an allOf (left open: the allOf is closed)."""
    if isinstance(node, list):
        return [_adjust(v, strict) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: [_adjust(m, strict, part=True) for m in v] if k == "allOf" else _adjust(v, strict)
            for k, v in node.items()}
    if strict and "allOf" in node and "unevaluatedProperties" not in node:
        node["unevaluatedProperties"] = False
    elif strict and not part and "properties" in node and "additionalProperties" not in node:
        node["additionalProperties"] = False
    if node.pop("nullable", False):
        return {"anyOf": [node, {"type": "null"}]}
    return node


def _parts(schemas: dict[str, Any]) -> set[str]:
    """The schemas an allOf names as its parts (by $ref)."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, dict):
            for m in node.get("allOf", ()):
                if "$ref" in m:
                    found.add(m["$ref"].rsplit("/", 1)[1])
            for v in node.values():
                walk(v)
    walk(schemas)
    return found


@cache
def _schemas(strict: bool) -> dict[str, Any]:
    schemas = copy.deepcopy(json.loads(DATA.read_text())["components"]["schemas"])
    for name, props in EXTENSIONS.items():
        schemas[name]["properties"].update(props)
    streamed = copy.deepcopy(schemas["CreateCompletionResponse"])
    fr = streamed["properties"]["choices"]["items"]["properties"]["finish_reason"]
    streamed["properties"]["choices"]["items"]["properties"]["finish_reason"] = {"anyOf": [fr, {"type": "null"}]}
    schemas["CreateCompletionResponse.streamed"] = streamed
    parts = _parts(schemas)
    return {k: _adjust(v, strict, part=k in parts) for k, v in schemas.items()}


@cache
def _validator(name: str, strict: bool) -> jsonschema.protocols.Validator:
    doc = {"components": {"schemas": _schemas(strict)}}
    registry = Registry().with_resource("urn:openai", Resource(doc, DRAFT202012))
    schema = {"$ref": f"urn:openai#/components/schemas/{name}"}
    return jsonschema.Draft202012Validator(schema, registry=registry)


def check(name: str, obj: Any, strict: bool = True) -> None:
    """Raise jsonschema.ValidationError where `obj` breaks OpenAI's schema `name`."""
    _validator(name, strict).validate(obj)
