"""The server's own OpenAPI document (/openapi.json), describing what the server does: FastAPI's document of the
routes and their pydantic models, then corrected where it would say otherwise.

- Errors: each operation lists the statuses it can answer with OpenAI's error body (`ErrorResponse`): 400 (a bad
  request: validation is the server's own, so never FastAPI's 422), 401 (with `--api-key`), 404 (another model
  or route), 408 (a body that stalls or trickles), 413 (a body over `--max-body`), 429 (queue full, with
  Retry-After), 500 and 503 (shutting down) where a route runs the model.
- Streams: the generation routes answer `text/event-stream` too (`stream: true`).
- `/metrics` is Prometheus text (text/plain), not JSON.
- Numeric ranges in JSON Schema's words (`minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum`, where
  pydantic leaves its own `ge` / `le` / `gt` / `lt` from constraints it could not place).
- Requests the server refuses are not valid by the document where JSON Schema can say so: /tokenize takes
  `prompt` or `messages` (exactly one), a chat message needs content unless it is an assistant's, a tool
  message needs its tool_call_id.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR = {"type": "object", "required": ["error"], "additionalProperties": False, "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "additionalProperties": False,
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}

_WHY = {400: "A bad request (the field named in `param`)", 401: "No valid API key (with --api-key)",
        404: "No such model (or route)", 408: "The request body stalled or took too long to arrive",
        413: "The request body is over --max-body", 429: "The server is full: retry after Retry-After seconds",
        500: "The engine failed during this request's step", 503: "The server is shutting down"}
_GENERATE = (400, 401, 404, 408, 413, 429, 500, 503)
_ROUTES: dict[tuple[str, str], tuple[int, ...]] = {
    ("/v1/completions", "post"): _GENERATE, ("/v1/chat/completions", "post"): _GENERATE,
    ("/v1/responses", "post"): _GENERATE, ("/tokenize", "post"): (400, 401, 404, 408, 413),
    ("/detokenize", "post"): (400, 401, 404, 408, 413), ("/v1/models", "get"): (401,),
    ("/v1/models/{model_id}", "get"): (401, 404), ("/tokenizer_info", "get"): (401,),
}
_STREAMS = {"/v1/completions", "/v1/chat/completions", "/v1/responses"}
_RANGES = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def document(app: FastAPI) -> dict[str, Any]:
    """The document (the module docstring), made once and kept on the app."""
    made: dict[str, Any] | None = app.openapi_schema
    if made:
        return made
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                      description="webtensor's OpenAI-compatible API (and vLLM's /tokenize, /detokenize, "
                                  "/tokenizer_info)")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["ErrorResponse"] = ERROR
    for path, ops in doc["paths"].items():
        path_key = path.replace("{model_id:path}", "{model_id}")
        for method, op in ops.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for status in _ROUTES.get((path_key, method), ()):
                responses[str(status)] = {"description": _WHY[status], "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
            if path in _STREAMS:
                responses["200"]["content"]["text/event-stream"] = {
                    "schema": {"type": "string", "description": "server-sent events (stream: true)"}}
    metrics = doc["paths"]["/metrics"]["get"]["responses"]["200"]
    metrics["content"] = {"text/plain": {"schema": {"type": "string"}}}
    metrics["description"] = "Prometheus metrics (text exposition format)"
    _request_rules(schemas)
    doc = _ranges(doc)
    app.openapi_schema = doc
    return dict(doc)


def _request_rules(schemas: dict[str, Any]) -> None:
    """Rules of several fields that the server checks, in JSON Schema."""
    tok = schemas.get("TokenizeRequest")
    if tok is not None:
        tok["oneOf"] = [{"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                        {"required": ["messages"], "properties": {"messages": {"type": "array"}}}]
    msg = schemas.get("ChatMessage")
    if msg is not None:
        msg["allOf"] = [
            {"if": {"properties": {"role": {"not": {"const": "assistant"}}}},
             "then": {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}}},
            {"if": {"properties": {"role": {"const": "tool"}}}, "then": {"required": ["tool_call_id"]}}]


def _ranges(node: Any) -> Any:
    if isinstance(node, list):
        return [_ranges(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in _RANGES and isinstance(v, (int, float)) and "type" in node:
            out[_RANGES[k]] = v
        else:
            out[k] = _ranges(v)
    return out
