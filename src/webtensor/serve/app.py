"""The HTTP routes (FastAPI): /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

Streams are server-sent events, `data: {json}` per token and `data: [DONE]` at the end; an error
during a stream arrives as `data: {"error": {...}}`. Every error, malformed JSON and validation errors
included, has OpenAI's body {"error": {"message", "type", "param", "code"}}. With an API key, /v1/*
needs `Authorization: Bearer KEY` (401 otherwise); /health and /metrics stay open for load balancers.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from .. import chat
from .engine import Engine, Sampling
from .metrics import CONTENT_TYPE, Metrics
from .protocol import (
    APIError,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessageOut,
    ChatRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Delta,
    ModelCard,
    ModelList,
    SamplingRequest,
    Usage,
    validation_error,
)
from .scheduler import Generation, Scheduler


def create_app(engine: Engine, max_queue: int = 256, api_key: str | None = None,
               scheduler: Scheduler | None = None, prefill_budget: int = 256) -> FastAPI:
    metrics = scheduler.metrics if scheduler else Metrics()
    sched = scheduler or Scheduler(engine, max_queue, metrics, prefill_budget=prefill_budget)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sched.start()
        yield
        await sched.stop()

    app = FastAPI(title="webtensor", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.scheduler, app.state.metrics = sched, metrics
    _install_errors(app)
    app.add_middleware(_Guard, api_key=api_key, metrics=metrics)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "draining" if sched.draining else "ok", "model": engine.name,
                "active": sched.active, "queued": sched.queued, "max_batch": engine.max_batch,
                "engine": getattr(engine, "engine", None), "graphs": getattr(engine, "graph_stats", None)}

    @app.get("/metrics")
    async def metrics_text() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return ModelList(data=[ModelCard(id=engine.name)]).model_dump()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Any:
        _check_model(engine, body.model)
        p = body.prompt_value()
        ids = _prompt_ids(engine, p)
        seq = _sequence(engine, ids, body, body.max_tokens,
                        default_max=16, stops=body.stops())
        sched.submit(seq)
        rid, name = f"cmpl-{uuid.uuid4().hex}", engine.name

        def chunk(text: str, finish: Any) -> Completion:
            return Completion(id=rid, model=name, choices=[CompletionChoice(text=text, finish_reason=finish)])

        if body.stream:
            return _sse(sched, seq, body.include_usage(), lambda: [], chunk,
                        lambda u: Completion(id=rid, model=name, choices=[], usage=u))
        text, finish = await _collect(sched, seq)
        return Completion(id=rid, model=name, choices=[CompletionChoice(text=text, finish_reason=finish)],
                          usage=_usage(seq)).model_dump()

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest) -> Any:
        _check_model(engine, body.model)
        ids = _prompt_ids(engine, _render_chat(engine, body.messages), special=False)
        stops = list(dict.fromkeys([*body.stops(), *([] if engine.chat_template else chat.PLAIN_STOPS)]))
        seq = _sequence(engine, ids, body, body.max_new(), default_max=None, stops=stops)
        sched.submit(seq)
        rid, name = f"chatcmpl-{uuid.uuid4().hex}", engine.name

        def chunk(text: str, finish: Any) -> ChatCompletionChunk:
            delta = Delta(content=text) if finish is None or text else Delta()
            return ChatCompletionChunk(id=rid, model=name,
                                       choices=[ChatChunkChoice(delta=delta, finish_reason=finish)])

        def first() -> list[ChatCompletionChunk]:
            return [ChatCompletionChunk(id=rid, model=name,
                                        choices=[ChatChunkChoice(delta=Delta(role="assistant", content=""))])]

        if body.stream:
            return _sse(sched, seq, body.include_usage(), first, chunk,
                        lambda u: ChatCompletionChunk(id=rid, model=name, choices=[], usage=u))
        text, finish = await _collect(sched, seq)
        return ChatCompletion(id=rid, model=name, usage=_usage(seq), choices=[
            ChatChoice(message=ChatMessageOut(content=text), finish_reason=finish)]).model_dump()

    return app


# -- request -> sequence ----------------------------------------------------------------------------
def _check_model(engine: Engine, model: str) -> None:
    if model != engine.name:
        raise APIError(404, f"the model {model!r} does not exist here; this server serves {engine.name!r}",
                       param="model", code="model_not_found")


def _render_chat(engine: Engine, messages: Any) -> str:
    """The conversation through the model's chat template (webtensor's plain one where it has none)."""
    from ..errors import WebtensorError

    tok = engine.tokenizer
    template = chat.ChatTemplate(engine.chat_template or chat.PLAIN_TEMPLATE,
                                 bos_token=getattr(tok, "bos_token", "") or "", eos_token=getattr(tok, "eos_token", "") or "")
    try:
        return template.render([{"role": m.role, "content": m.text()} for m in messages], add_generation_prompt=True)
    except WebtensorError as e:  # the template's raise_exception: the conversation is refused
        raise APIError(400, f"messages: {e}", param="messages") from None


def _prompt_ids(engine: Engine, prompt: str | list[int], special: bool = True) -> list[int]:
    """A prompt's ids: text encoded (`special`: with the tokenizer's own special tokens, e.g. a BOS, as HF's
    tokenizer(text) adds them; a rendered chat carries its own), or ids checked."""
    if isinstance(prompt, str):
        ids = engine.tokenizer.encode(prompt, add_special_tokens=special)
    else:
        bad = [i for i in prompt if not 0 <= i < engine.vocab_size]
        if bad:
            raise APIError(400, f"prompt: token id {bad[0]} is out of range for a vocabulary of "
                           f"{engine.vocab_size}", param="prompt", code="invalid_token")
        ids = list(prompt)
    if not ids:  # an empty prompt: start from the BOS token (GPT-2: <|endoftext|>, its EOS, as it was trained)
        start = engine.bos_id if engine.bos_id is not None else min(engine.eos_ids, default=None)
        if start is None:
            raise APIError(400, "prompt: the prompt is empty", param="prompt")
        ids = [start]
    if len(ids) >= engine.n_ctx:
        raise APIError(400, f"the prompt is {len(ids)} tokens; this model's context is {engine.n_ctx} tokens, "
                       "which must also hold at least one new token", param="prompt",
                       code="context_length_exceeded")
    return ids


def _sequence(engine: Engine, ids: list[int], body: SamplingRequest, max_tokens: int | None,
              default_max: int | None, stops: list[str]) -> Generation:
    room = engine.n_ctx - len(ids)
    if max_tokens is None:
        max_tokens = room if default_max is None else min(default_max, room)
    elif len(ids) + max_tokens > engine.n_ctx:
        raise APIError(400, f"the prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) exceeds this model's "
                       f"context of {engine.n_ctx} tokens", param="max_tokens", code="context_length_exceeded")
    seed = body.seed if body.seed is not None else secrets.randbits(63)
    temperature = 1.0 if body.temperature is None else body.temperature
    sampling = Sampling(temperature, body.top_k, body.top_p, seed)
    return Generation(ids, max_tokens, sampling, stops, ignore_eos=body.ignore_eos)


def _usage(seq: Generation) -> Usage:
    return Usage.of(len(seq.prompt), len(seq.generated))


async def _collect(sched: Scheduler, seq: Generation) -> tuple[str, Any]:
    parts: list[str] = []
    try:
        async for ev in seq.stream():
            if ev.error is not None:
                raise ev.error
            parts.append(ev.text)
            if ev.finish is not None:
                return "".join(parts), ev.finish
    finally:
        sched.cancel(seq)  # a no-op once done; frees the slot if the handler was cancelled
    raise APIError(500, "the sequence ended without a finish reason")


def _sse(sched: Scheduler, seq: Generation, include_usage: bool, first: Callable[[], list[Any]],
         chunk: Callable[[str, Any], Any], usage_chunk: Callable[[Usage], Any]) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        try:
            for c in first():
                yield _data(c.model_dump(exclude_none=False))
            frame = _framer(chunk)
            async for ev in seq.stream():
                if ev.error is not None:
                    yield _data(ev.error.body())
                    break
                yield frame(ev.text) if ev.finish is None else _data(chunk(ev.text, ev.finish).model_dump())
                if ev.finish is not None and include_usage:
                    yield _data(usage_chunk(_usage(seq)).model_dump())
            yield "data: [DONE]\n\n"
        finally:
            sched.cancel(seq)  # the client went away (or the stream ended): free the slot

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


_MARK = "\ue000webtensor-text\ue000"  # a private-use string no JSON encoder leaves as is


def _framer(chunk: Callable[[str, Any], Any]) -> Callable[[str], str]:
    """text -> the event `_data(chunk(text, None).model_dump())`, from a template made once per
    stream (the JSON of a chunk around a marker for its text): a token's event without building and
    dumping a pydantic model each time (the same bytes, the stream's first `created` throughout)."""
    head, tail = _data(chunk(_MARK, None).model_dump()).split(json.dumps(_MARK), 1)
    return lambda text: head + json.dumps(text) + tail


# -- errors, auth, request counts -----------------------------------------------------------------------
def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        e = validation_error(list(exc.errors()))
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        e = APIError(exc.status_code, str(exc.detail), code=None)
        return JSONResponse(e.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        e = APIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")
        return JSONResponse(e.body(), status_code=500)


class _Guard:
    """ASGI middleware: the API key on /v1/*, and a request count by route and status."""

    def __init__(self, app: Callable[..., Awaitable[None]], api_key: str | None, metrics: Metrics):
        self.app, self.api_key, self.metrics = app, api_key, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path: str = scope.get("path", "")
        route = path if path in _ROUTES else "other"
        status = {"code": 500}

        async def counting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if self.api_key is not None and path.startswith("/v1/") and not self._authorized(scope):
                e = APIError(401, "a valid API key is needed: send the header 'Authorization: Bearer KEY'",
                             code="invalid_api_key")
                await JSONResponse(e.body(), status_code=401,
                                   headers={"WWW-Authenticate": "Bearer"})(scope, receive, counting_send)
                return
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.requests.labels(route, str(status["code"])).inc()

    def _authorized(self, scope: dict[str, Any]) -> bool:
        headers = dict(scope.get("headers") or [])
        got = headers.get(b"authorization", b"").decode("latin-1")
        return secrets.compare_digest(got.encode("latin-1"), f"Bearer {self.api_key}".encode())


_ROUTES = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}
