"""The HTTP routes (FastAPI): /v1/completions, /v1/chat/completions, /v1/responses, /v1/models(/{id}),
/tokenize, /detokenize, /tokenizer_info, /health, /metrics, /openapi.json.

Streams are server-sent events, `data: {json}` per token and `data: [DONE]` at the end; an error
during a stream arrives as `data: {"error": {...}}`, then `data: [DONE]`. Every error, malformed JSON
and validation errors included, has OpenAI's body {"error": {"message", "type", "param", "code"}}.

Limits, so that no request can hurt another: a request body over `max_body` bytes is refused (413)
before it is read (by its Content-Length) or as soon as it passes the limit (a chunked body), and
nothing is buffered beyond it; prompts are tokenized in a worker thread (the tokenizer releases the
GIL), never on the event loop, and a text prompt longer than the context could hold in any
tokenization (its UTF-8 bytes over n_ctx times the longest token's bytes) is refused without
being tokenized at all.

With an API key, /v1/*, /tokenize and /detokenize need `Authorization: Bearer KEY` (401 otherwise);
/health, /metrics and /openapi.json stay open for load balancers and tools. With `cors_origins`,
browsers on those origins may call the API: CORS preflights (OPTIONS) are answered before the key
is checked, as browsers send them without credentials. GET routes answer HEAD too.

Conversations render through the model's chat template, checked when the app is made (`_Chats`): one that cannot
render a simple conversation leaves the server up, as vLLM's does, and each request that needs it is answered 400
naming the template's error; a reply ends where `chat.turn_stops` says a turn ends (the one rule of every front end).

/tokenize and /detokenize follow vLLM's shapes: `{"prompt": text}` or `{"messages": [...]}` (the
chat template's prompt) -> `{"count", "max_model_len", "tokens"}` (+ `token_strs`, each token's
text, when `return_token_strs`), and `{"tokens": [...]}` -> `{"prompt": text}`.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import chat
from ..errors import ChatTemplateError, SamplingError
from ..runtime.blocks import held_blocks
from ..runtime.logprobs import TokenLogprob
from ..sampling import choice_seed
from . import conversation, openapi, responses
from .engine import Engine, Sampling
from .metrics import CONTENT_TYPE, Metrics
from .protocol import (
    NEG_INF_LOGPROB,
    APIError,
    ChatChoice,
    ChatCompletion,
    ChatLogprobs,
    ChatMessageOut,
    ChatRequest,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    FinishReason,
    ModelCard,
    ModelList,
    ResponseFormat,
    ResponseObject,
    ResponsesRequest,
    SamplingRequest,
    TokenizeRequest,
    TokenizeResponse,
    ToolCallOut,
    Usage,
    validation_error,
)
from .scheduler import DEFAULT_PREFILL, FOLLOW_STEPS, Event, Generation, Scheduler

log = logging.getLogger("webtensor.serve")

MAX_BODY = 8 * 1024 * 1024  # bytes: a request body larger is refused (413); `--max-body`
BODY_TIMEOUT = 30.0  # seconds a request body may stall between its parts (408); `--idle-timeout`
BODY_DEADLINE = 60.0  # seconds a whole request body may take to arrive (408); `--body-timeout`


def create_app(engine: Engine, max_queue: int = 256, api_key: str | None = None,
               scheduler: Scheduler | None = None, prefill_budget: int | None = None, max_body: int = MAX_BODY,
               cors_origins: Sequence[str] = (), body_timeout: float = BODY_TIMEOUT,
               body_deadline: float = BODY_DEADLINE) -> FastAPI:
    metrics = scheduler.metrics if scheduler else Metrics()
    sched = scheduler or Scheduler(engine, max_queue, metrics, prefill_budget=prefill_budget)
    prompts = _Prompts(engine)
    grammars = conversation.Grammars(engine)
    chats = _Chats(engine)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sched.start()
        await prompts.start()
        yield
        await sched.stop()

    app = FastAPI(title="webtensor", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    app.state.scheduler, app.state.metrics = sched, metrics
    app.openapi = functools.partial(openapi.document, app)  # type: ignore[method-assign]
    _install_errors(app)
    app.add_middleware(_Guard, api_key=api_key, metrics=metrics, max_body=max_body, body_timeout=body_timeout,
                       body_deadline=body_deadline)
    if cors_origins:  # (added last: outermost, so preflights are answered before the key is asked for)
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST", "HEAD"],
                           allow_headers=["*"], expose_headers=["Retry-After"], max_age=600)

    def card() -> ModelCard:
        return ModelCard(id=engine.name, created=started, max_model_len=engine.n_ctx)

    @_get(app, "/health")
    async def health() -> dict[str, Any]:
        return {"status": "draining" if sched.draining else "ok", "model": engine.name,
                "active": sched.active, "queued": sched.queued, "max_batch": engine.max_batch,
                "engine": getattr(engine, "engine", None), "graphs": getattr(engine, "graph_stats", None),
                "prefill_chunk": sched.prefill_chunk, "prefill_budget": sched.prefill_budget, "kv": sched.kv_stats()}

    @_get(app, "/metrics")
    async def metrics_text() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @_get(app, "/v1/models", responses={200: {"model": ModelList}})
    async def models() -> dict[str, Any]:
        return ModelList(data=[card()]).model_dump()

    @_get(app, "/v1/models/{model_id:path}", responses={200: {"model": ModelCard}})
    async def model(model_id: str) -> dict[str, Any]:
        _check_model(engine, model_id, "model_id")
        return card().model_dump()

    @app.post("/v1/completions", responses={200: {"model": Completion}})
    async def completions(body: CompletionRequest) -> Any:
        _check_model(engine, body.model)
        texts = body.prompts()
        many = len(texts) > 1
        n, k = body.choices(), body.logprobs
        echo_lps = bool(body.echo) and k is not None
        seqs: list[Generation] = []
        prompt_texts: list[str] = []
        for i, p in enumerate(texts):
            ids = await prompts.ids(p, f"prompt.{i}" if many else "prompt")
            text = p if isinstance(p, str) else _detokenize(engine, ids)
            for j in range(n):
                seqs.append(_sequence(engine, ids, body, body.max_tokens, default_max=16, stops=body.stops(),
                                      choice=j, logprobs=k, echo=echo_lps))
                prompt_texts.append(text if body.echo else "")
        _start(sched, seqs)
        rid, name, created = f"cmpl-{uuid.uuid4().hex}", engine.name, int(time.time())
        lps = [_CompletionLogprobs(engine) if k is not None else None for _ in seqs]

        def chunk(index: int, ev: Event) -> dict[str, Any]:  # (usage: on the last chunk alone)
            text, lp, lp_index = ev.text, None, lps[index]
            if prompt_texts[index] and not sent[index]:
                text = prompt_texts[index] + text
            if lp_index is not None:
                lp = lp_index.part(seqs[index], ev, first=not sent[index])
            sent[index] = True
            return {"id": rid, "object": "text_completion", "created": created, "model": name,
                    "choices": [{"index": index, "text": text, "logprobs": lp, "finish_reason": ev.finish}]}

        def usage_chunk(u: Usage) -> dict[str, Any]:
            return {"id": rid, "object": "text_completion", "created": created, "model": name, "choices": [],
                    "usage": u.model_dump()}

        sent = [False] * len(seqs)
        plain = k is None and not body.echo
        if body.stream:
            return _sse(sched, seqs, body.include_usage(), lambda i: [], chunk, usage_chunk, n, plain)
        outs = await _collect(sched, seqs)
        choices = []
        for i, (t, f) in enumerate(outs):
            lp_i = lps[i]
            lp = CompletionLogprobs.model_validate(lp_i.whole(seqs[i])) if lp_i is not None else None
            choices.append(CompletionChoice(index=i, text=prompt_texts[i] + t, logprobs=lp, finish_reason=f))
        return Completion(id=rid, model=name, created=created, usage=_usage(seqs, n),
                          choices=choices).model_dump()

    @app.post("/v1/chat/completions", responses={200: {"model": ChatCompletion}})
    async def chat_completions(body: ChatRequest) -> Any:
        _check_model(engine, body.model)
        functions = body.function_tools()
        prompt = chats.render(body.messages, functions=functions, kwargs=body.template_kwargs(),
                              describe_tools=body.choice() != "none")
        ids = await prompts.ids(prompt, "messages", special=False)
        plan = await conversation.plan(engine, grammars, prompt, functions, body.choice(),
                                       body.parallel_tool_calls is not False, "tools.{}.function.parameters")
        k = (body.top_logprobs or 0) if body.logprobs else None
        n = body.choices()
        grammar = plan.grammar or await _grammar(engine, body.response_format)
        seqs = [_sequence(engine, ids, body, body.max_new(), default_max=None, stops=chats.stops(body.stops()),
                          choice=j, logprobs=k, grammar=grammar, turn_end=chats.turn.token_ids, shown=plan.shown)
                for j in range(n)]
        _start(sched, seqs)
        rid, name, created = f"chatcmpl-{uuid.uuid4().hex}", engine.name, int(time.time())
        usage_null = {"usage": None} if body.include_usage() else {}
        parsers = [plan.parser() for _ in seqs]

        def message(index: int, delta: dict[str, Any], finish: Any, lp: Any = None) -> dict[str, Any]:
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": name,
                    "choices": [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}],
                    **usage_null}

        def chunk(index: int, ev: Event) -> dict[str, Any] | None:
            lp = {"content": _chat_logprobs(engine, ev.logprobs or []), "refusal": None} if k is not None else None
            if plan.plain:
                return message(index, {"content": ev.text} if ev.finish is None or ev.text else {}, ev.finish, lp)
            parser = parsers[index]
            d = parser.feed(ev.text)
            if ev.finish is not None:
                d.extend(parser.finish())
            delta: dict[str, Any] = {}
            if d.reasoning:
                delta["reasoning_content"] = d.reasoning
            if d.content:
                delta["content"] = d.content
            if d.calls:
                delta["tool_calls"] = d.calls
            if not delta and ev.finish is None and lp is None:
                return None
            return message(index, delta, _finish(ev.finish, parser.started > 0), lp)

        def first(index: int) -> list[dict[str, Any]]:  # the role, once, in the stream's first chunk
            return [message(index, {"role": "assistant", "content": ""}, None)]

        def usage_chunk(u: Usage) -> dict[str, Any]:
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": name, "choices": [],
                    "usage": u.model_dump(exclude_none=True)}

        if body.stream:
            return _sse(sched, seqs, body.include_usage(), first, chunk, usage_chunk, n, k is None and plan.plain,
                        cached=True)
        outs = await _collect(sched, seqs)
        choices = []
        for i, (text, f) in enumerate(outs):
            answer = parsers[i].whole(text) if not plan.plain else None
            msg = ChatMessageOut(content=text) if answer is None else ChatMessageOut(
                content=answer.content, reasoning_content=answer.reasoning,
                tool_calls=[ToolCallOut.model_validate(c.openai()) for c in answer.calls] or None)
            finish = _finish(f, bool(answer and answer.calls)) or f
            choices.append(ChatChoice(index=i, message=msg, finish_reason=finish,
                                      logprobs=None if k is None else ChatLogprobs.model_validate(
                                          {"content": _chat_logprobs(engine, seqs[i].reported)})))
        out = ChatCompletion(id=rid, model=name, created=created, usage=_usage(seqs, n, cached=True),
                             choices=choices).model_dump()
        for c in out["choices"]:  # (tool_calls and reasoning_content: only where there are some)
            for key in ("tool_calls", "reasoning_content"):
                if c["message"][key] is None:
                    del c["message"][key]
        return out

    @app.post("/v1/responses", responses={200: {"model": ResponseObject}})
    async def create_response(body: ResponsesRequest) -> Any:
        """The Responses API: the prompt, the sequence and the reading of the answer are chat's for the same
        messages (responses.py: the answer's output items, whole or streamed)."""
        _check_model(engine, body.model)
        functions = body.function_tools()
        prompt = chats.render(body.messages(), param="input", functions=functions, kwargs=body.template_kwargs(),
                              describe_tools=body.choice() != "none")
        ids = await prompts.ids(prompt, "input", special=False)
        plan = await conversation.plan(engine, grammars, prompt, functions, body.choice(),
                                       body.parallel_tool_calls is not False, "tools.{}.parameters")
        grammar = plan.grammar or await _grammar(engine, body.response_format(), param="text.format")
        seq = _sequence(engine, ids, body.sampling(), body.max_output_tokens, default_max=None,
                        stops=chats.stops([]), grammar=grammar, max_param="max_output_tokens",
                        turn_end=chats.turn.token_ids, shown=plan.shown)
        _start(sched, [seq])
        reply = responses.Reply(body, engine.name, seq, plan)
        if body.stream:
            return responses.stream(sched, reply)
        [(text, finish)] = await _collect(sched, [seq])
        return reply.whole(text, finish)

    @_get(app, "/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        """vLLM's /tokenizer_info (the special tokens' texts and the context; lm-evaluation-harness reads it to
        use this server's /tokenize)."""
        def eos_text() -> str | None:
            i = min(engine.eos_ids, default=None)
            return None if i is None else engine.tokenizer.token_bytes(i, skip_special_tokens=False).decode(
                "utf-8", "replace")

        tok = engine.tokenizer
        return {"tokenizer_class": "webtensor", "eos_token": getattr(tok, "eos_token", None) or eos_text(),
                "bos_token": getattr(tok, "bos_token", None), "pad_token": None, "model_max_length": engine.n_ctx,
                "chat_template": engine.chat_template}

    @app.post("/tokenize", responses={200: {"model": TokenizeResponse}})
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        if body.model is not None:
            _check_model(engine, body.model)
        if body.prompt is not None:
            ids = await prompts.encode(body.prompt, body.add_special_tokens)
        else:
            functions = [t.function.model_dump(exclude_none=True) for t in body.tools or []]
            prompt = chats.render(body.messages or [], body.add_generation_prompt, functions=functions,
                                  kwargs=body.chat_template_kwargs)
            ids = await prompts.encode(prompt, False)
        strs = None
        if body.return_token_strs:  # (special tokens by their text, as vLLM gives them)
            strs = [engine.tokenizer.token_bytes(i, skip_special_tokens=False).decode("utf-8", "replace")
                    for i in ids]
        return TokenizeResponse(count=len(ids), max_model_len=engine.n_ctx, tokens=ids,
                                token_strs=strs).model_dump(exclude_none=True)

    @app.post("/detokenize", responses={200: {"model": DetokenizeResponse}})
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        if body.model is not None:
            _check_model(engine, body.model)
        _check_ids(engine, body.tokens, "tokens")
        raw = b"".join(engine.tokenizer.token_bytes(i) for i in body.tokens)
        return DetokenizeResponse(prompt=raw.decode("utf-8", "replace")).model_dump()

    return app


def _get(app: FastAPI, path: str, **kw: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A GET route that answers HEAD too (HEAD left out of /openapi.json: one operation a route)."""
    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        app.add_api_route(path, fn, methods=["GET"], **kw)
        app.add_api_route(path, fn, methods=["HEAD"], include_in_schema=False)
        return fn
    return add


# -- request -> sequence ----------------------------------------------------------------------------
def _check_model(engine: Engine, model: str, param: str = "model") -> None:
    if model != engine.name:
        raise APIError(404, f"the model {model!r} does not exist here; this server serves {engine.name!r}",
                       param=param, code="model_not_found")


class _Chats:
    """Conversations through the model's chat template (webtensor's plain one where it has none), checked once when
    the server starts (`chat.check_template`): a template that cannot render a simple conversation leaves the server
    up, as vLLM does (completions need no template), and every request that needs it answered 400 with the
    template's error. `turn` is where an assistant's turn ends (`chat.turn_stops`)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.broken = template_problem(engine)
        self.turn = chat.turn_stops(engine) if self.broken is None else chat.TurnStops()

    def render(self, messages: Any, add_generation_prompt: bool = True, param: str = "messages",
               functions: list[dict[str, Any]] | None = None, kwargs: dict[str, Any] | None = None,
               describe_tools: bool = True) -> str:
        """The prompt (`conversation.render`: with the request's tools, its history of calls and results and its
        chat_template_kwargs)."""
        if self.broken is not None:
            raise APIError(400, f"{param}: this model's chat template cannot render conversations (found when the "
                           f"server started): {self.broken}; /v1/completions takes a prompt of text",
                           param=param, code="chat_template_error")
        return conversation.render(self.engine, messages, functions, kwargs, add_generation_prompt, param,
                                   describe_tools)

    def stops(self, stops: Sequence[str]) -> list[str]:
        """A chat's stop strings: the request's, and the turn's (the plain template's next-turn markers)."""
        return list(dict.fromkeys([*stops, *self.turn.strings]))


def template_problem(engine: Any) -> str | None:
    """What is wrong with the model's chat template (`chat.check_template`), or None where it works."""
    try:
        chat.check_template(engine)
    except ChatTemplateError as e:
        return str(e)
    return None


def _check_ids(engine: Engine, ids: Sequence[int], param: str) -> None:
    bad = next((i for i in ids if not 0 <= i < engine.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"{param}: token id {bad} is out of range for a vocabulary of {engine.vocab_size}",
                       param=param, code="invalid_token")


class _Prompts:
    """Prompts to token ids, checked against the context. Text is tokenized in a worker thread
    (`tokenizers` releases the GIL: the event loop serves the other requests meanwhile), unless it
    cannot fit: a text of more UTF-8 bytes than n_ctx tokens of the longest token's bytes makes more
    than n_ctx tokens however it is cut, so it is refused before any tokenizing."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.max_bytes: int | None = None  # n_ctx * the longest token's bytes (found at start)

    async def start(self) -> None:
        e = self.engine

        def longest() -> int:
            return max(len(e.tokenizer.token_bytes(i)) for i in range(e.vocab_size))
        try:
            self.max_bytes = e.n_ctx * await asyncio.to_thread(longest)
        except Exception:  # noqa: BLE001 - a tokenizer without every id: no early refusal, that is all
            log.warning("the tokenizer does not give every token's bytes: long prompts are tokenized to be refused")

    async def encode(self, text: str, special: bool = True) -> list[int]:
        return await asyncio.to_thread(functools.partial(self.engine.tokenizer.encode, text,
                                                         add_special_tokens=special))

    async def ids(self, prompt: str | list[int], param: str, special: bool = True) -> list[int]:
        """A prompt's ids: text encoded (`special`: with the tokenizer's own special tokens, e.g. a BOS, as HF's
        tokenizer(text) adds them; a rendered chat writes its own), or ids checked."""
        e = self.engine
        if isinstance(prompt, str):
            size = len(prompt.encode("utf-8"))
            if self.max_bytes is not None and size > self.max_bytes:
                raise APIError(400, f"{param}: the prompt is {size} bytes, more than this model's context of "
                               f"{e.n_ctx} tokens can hold", param=param, code="context_length_exceeded")
            ids = await self.encode(prompt, special)
        else:
            _check_ids(e, prompt, param)
            ids = list(prompt)
        if not ids:  # an empty prompt: start from the BOS token (GPT-2: <|endoftext|>, its EOS, as it was trained)
            start = e.bos_id if e.bos_id is not None else min(e.eos_ids, default=None)
            if start is None:
                raise APIError(400, f"{param}: the prompt is empty", param=param)
            ids = [start]
        if len(ids) >= e.n_ctx:
            raise APIError(400, f"{param}: the prompt is {len(ids)} tokens; this model's context is {e.n_ctx} "
                           "tokens, which must also hold at least one new token", param=param,
                           code="context_length_exceeded")
        return ids


def _sequence(engine: Engine, ids: list[int], body: SamplingRequest, max_tokens: int | None,
              default_max: int | None, stops: list[str], choice: int = 0, logprobs: int | None = None,
              echo: bool = False, grammar: str | None = None, max_param: str = "max_tokens",
              shown: frozenset[int] = frozenset(), turn_end: Sequence[int] = ()) -> Generation:
    """Choice `choice` of a request for prompt `ids`. Its seed: the request's (a fresh one where none is given),
    moved on for choices after the first by `sampling.choice_seed` (seed + choice * 2**64: each choice its own
    stream of draws, the first one's that of the same request with n = 1). `logprobs`: report each token's
    log-probability and the k most likely; `echo`: the prompt's too. `turn_end`: token ids that end a chat's turn
    besides EOS (`chat.turn_stops`), stop ids as the request's own `stop_token_ids` are."""
    room = engine.n_ctx - len(ids)
    pool = kv_positions(engine)  # (a sequence never holds more than the whole KV pool)
    if pool is not None:
        if len(ids) > pool:
            raise APIError(400, f"prompt: the prompt ({len(ids)} tokens) needs more KV cache than this server's pool "
                           f"holds ({pool} positions: --kv-memory)", param="prompt", code="context_length_exceeded")
        room = min(room, pool - len(ids) + 1)  # (the last new token is never fed: it takes no position)
    if max_tokens is None:
        max_tokens = room if default_max is None else min(default_max, room)
    elif len(ids) + max_tokens > engine.n_ctx:
        raise APIError(400, f"{max_param}: the prompt ({len(ids)} tokens) plus {max_tokens} new tokens exceeds this "
                       f"model's context of {engine.n_ctx} tokens", param=max_param, code="context_length_exceeded")
    elif max_tokens > room:
        raise APIError(400, f"{max_param}: the prompt ({len(ids)} tokens) plus {max_tokens} new tokens need "
                       f"{len(ids) + max_tokens - 1} positions of KV cache, more than this server's pool holds ({pool} "
                       f"positions: --kv-memory); at most {room} new tokens fit", param=max_param,
                       code="context_length_exceeded")
    if body.min_tokens is not None and body.min_tokens > max_tokens:
        raise APIError(400, f"min_tokens: {body.min_tokens} is more than the {max_tokens} tokens this request may "
                       f"generate ({max_param})", param="min_tokens", code="invalid_value")
    seed = choice_seed(body.seed if body.seed is not None else secrets.randbits(63), choice)
    temperature, top_k, top_p = body.sampling_values()
    bias = body.bias()
    for param, used in (("logit_bias", list(bias)), ("stop_token_ids", body.stop_token_ids or [])):
        _check_ids(engine, used, param)
    sampling = Sampling(temperature, top_k, top_p, seed, min_p=body.min_p or 0.0,
                        presence_penalty=body.presence_penalty or 0.0, frequency_penalty=body.frequency_penalty or 0.0,
                        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
                        logit_bias=tuple(sorted(bias.items())), min_tokens=body.min_tokens or 0,
                        stop_token_ids=tuple(sorted({*(body.stop_token_ids or ()), *turn_end})), logprobs=logprobs,
                        constrained=grammar is not None)
    try:  # the sampler's own checks, here, so that nothing it refuses reaches an engine step
        sampling.params()
    except SamplingError as e:
        raise APIError(400, str(e), code="invalid_sampling") from None
    return Generation(ids, max_tokens, sampling, stops, ignore_eos=body.ignore_eos, echo=echo, grammar=grammar,
                      shown=shown)


def kv_positions(engine: Engine) -> int | None:
    """Positions of one sequence the engine's KV pool can hold (None: any number: an engine without a pool, or one
    whose model slides on every layer with a window whose blocks fit the pool: a sequence gives back the blocks
    behind it as it grows, `runtime.blocks.held_blocks`)."""
    n = getattr(engine, "kv_blocks", None)
    if n is None:
        return None
    block_size = int(getattr(engine, "block_size", 1))
    rows = max(int(getattr(engine, "prefill_chunk", DEFAULT_PREFILL[0])), FOLLOW_STEPS)
    if held_blocks(engine.n_ctx, block_size, getattr(engine, "kv_window", None), rows) <= n:
        return None  # (a whole context fits)
    return int(n) * block_size


async def _grammar(engine: Engine, fmt: ResponseFormat | None, param: str = "response_format") -> str | None:
    """The llguidance grammar of a chat request's response_format (None: free text), compiled and checked off the
    event loop; a schema it cannot compile is a 400."""
    if fmt is None or fmt.type == "text":
        return None
    from . import grammar as g

    schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None

    def build() -> str:
        grammar = g.compile_format(fmt.type, schema)
        g.check(grammar, g.grammar_tokenizer(engine.tokenizer, engine.vocab_size, engine.eos_ids))
        return grammar
    try:
        return await asyncio.to_thread(build)
    except g.GrammarError as e:
        raise APIError(400, f"{param}: {e}", param=param, code="invalid_schema") from None


def _start(sched: Scheduler, seqs: list[Generation]) -> None:
    """Submit the sequences that run (all admitted or none); one for no tokens and no prompt log-probabilities
    ends at once."""
    sched.submit_all([s for s in seqs if sched.needs_run(s)])
    for s in seqs:
        if not sched.needs_run(s):
            sched.finished_empty(s)


def _usage(seqs: Sequence[Generation], n: int = 1, cached: bool = False) -> Usage:
    """Usage of a request's sequences, `n` choices a prompt: each prompt counted once, every choice's tokens;
    `cached`: with prompt_tokens_details.cached_tokens (the prompt tokens found in a slot's prefix cache)."""
    prompts = seqs[::n]
    return Usage.of(sum(len(s.prompt) for s in prompts), sum(s.streamed for s in seqs),
                    sum(s.reused for s in prompts) if cached else None)


def _finish(finish: FinishReason | None, called: bool) -> FinishReason | None:
    """A chat choice's finish_reason: "tool_calls" where the answer called tools and ended by itself."""
    return "tool_calls" if finish == "stop" and called else finish


def _detokenize(engine: Engine, ids: Sequence[int]) -> str:
    return b"".join(engine.tokenizer.token_bytes(i) for i in ids).decode("utf-8", "replace")


def _token_bytes(engine: Engine, i: int) -> bytes:
    """A token's own bytes (a special token's text too)."""
    return engine.tokenizer.token_bytes(i, skip_special_tokens=False)


def token_key(raw: bytes) -> str:
    """A token as log-probabilities name it, losslessly: its text, or where its bytes are not whole UTF-8 (a
    part of a character) `bytes:` and each byte as a \\xNN escape (vLLM's form), so no two tokens share a key."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _lp(v: float) -> float:
    """A log-probability as JSON can carry it (-inf: NEG_INF_LOGPROB)."""
    return v if v > NEG_INF_LOGPROB else NEG_INF_LOGPROB


class _CompletionLogprobs:
    """The completions API's `logprobs` of one choice, whole or a stream's part at a time: tokens (`token_key`),
    their log-probabilities (the prompt's first: None), the k most likely {key: logprob}, and each token's offset
    in the choice's text (echo: the prompt's tokens first, offsets from the prompt's start): the characters of
    the text before it, decoded as the text is (a token that ends inside a character: the character starts at
    the next token's offset; special tokens add no text)."""

    def __init__(self, engine: Engine):
        self.engine, self.offset = engine, 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _entries(self, lps: Sequence[TokenLogprob | None], tokens: Sequence[int]) -> dict[str, Any]:
        out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        key = functools.partial(_token_bytes, self.engine)
        for tok, lp in zip(tokens, lps, strict=True):
            out["tokens"].append(token_key(key(tok)))
            out["token_logprobs"].append(None if lp is None else _lp(lp.logprob))
            out["top_logprobs"].append(None if lp is None else  # (the k most likely and the token itself, as vLLM)
                                       {token_key(key(i)): _lp(v) for i, v in
                                        sorted({*lp.top, (lp.token, lp.logprob)}, key=lambda e: (-e[1], e[0]))})
            out["text_offset"].append(self.offset)
            self.offset += len(self.decoder.decode(self.engine.tokenizer.token_bytes(tok)))
        return out

    def _prompt(self, seq: Generation) -> dict[str, Any] | None:
        return self._entries(seq.prompt_logprobs, seq.prompt) if seq.echo else None

    def whole(self, seq: Generation) -> dict[str, Any]:
        head = self._prompt(seq)
        tail = self._entries(seq.reported, [lp.token for lp in seq.reported])
        return {key: [*(head[key] if head else []), *tail[key]] for key in tail}

    def part(self, seq: Generation, ev: Event, first: bool) -> dict[str, Any]:
        head = self._prompt(seq) if first else None
        tail = self._entries(ev.logprobs or [], [lp.token for lp in ev.logprobs or []])
        return {key: [*(head[key] if head else []), *tail[key]] for key in tail}


def _chat_logprobs(engine: Engine, lps: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """Chat's `logprobs.content`: per token its key (`token_key`), log-probability, bytes and the k most likely."""
    def one(i: int, v: float) -> dict[str, Any]:
        raw = _token_bytes(engine, i)
        return {"token": token_key(raw), "logprob": _lp(v), "bytes": list(raw)}

    return [{**one(lp.token, lp.logprob), "top_logprobs": [one(i, v) for i, v in lp.top]} for lp in lps]


async def _collect(sched: Scheduler, seqs: list[Generation]) -> list[tuple[str, Any]]:
    """Each sequence's whole text and finish reason; the first error raised (the rest cancelled)."""

    async def one(seq: Generation) -> tuple[str, Any]:
        parts: list[str] = []
        async for ev in seq.stream():
            if ev.error is not None:
                raise ev.error
            parts.append(ev.text)
            if ev.finish is not None:
                return "".join(parts), ev.finish
        raise APIError(500, "the sequence ended without a finish reason")

    try:
        if len(seqs) == 1:
            return [await one(seqs[0])]
        return list(await asyncio.gather(*(one(s) for s in seqs)))
    finally:
        for s in seqs:
            sched.cancel(s)  # a no-op once done; frees the slot if the handler was cancelled or another failed


async def _events(seqs: list[Generation]) -> AsyncIterator[tuple[int, Event]]:
    """(choice index, event) as they come, from every sequence (one: its stream as it is)."""
    if len(seqs) == 1:
        async for one in seqs[0].stream():
            yield 0, one
        return
    queue: asyncio.Queue[tuple[int, Event | None]] = asyncio.Queue()

    async def pump(i: int, seq: Generation) -> None:
        async for ev in seq.stream():
            queue.put_nowait((i, ev))
        queue.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(seqs)]
    try:
        left = len(seqs)
        while left:
            i, ev = await queue.get()
            if ev is None:
                left -= 1
            else:
                yield i, ev
    finally:
        for t in tasks:
            t.cancel()


def _sse(sched: Scheduler, seqs: list[Generation], include_usage: bool,
         first: Callable[[int], list[dict[str, Any]]], chunk: Callable[[int, Event], dict[str, Any] | None],
         usage_chunk: Callable[[Usage], dict[str, Any]], n: int = 1, plain: bool = True,
         cached: bool = False) -> StreamingResponse:
    """`plain`: chunks carry text alone (no log-probabilities, no echo, nothing parsed): made from a template
    (`_framer`). `chunk` may give None: nothing to send for that event. `cached`: usage with its cached tokens."""
    def text_chunk(i: int) -> Callable[[str], dict[str, Any]]:
        def one(text: str) -> dict[str, Any]:
            c = chunk(i, Event(text))
            assert c is not None
            return c
        return one

    async def events() -> AsyncIterator[str]:
        try:
            for i in range(len(seqs)):
                for c in first(i):
                    yield _data(c)
            frames = [_framer(text_chunk(i)) if plain else None for i in range(len(seqs))]
            left = len(seqs)
            async for i, ev in _events(seqs):
                if ev.error is not None:
                    yield _data(ev.error.body())
                    break
                frame = frames[i]
                if frame is not None and ev.finish is None:
                    yield frame(ev.text)
                elif (piece := chunk(i, ev)) is not None:
                    yield _data(piece)
                if ev.finish is not None:
                    left -= 1
                    if not left and include_usage:
                        yield _data(usage_chunk(_usage(seqs, n, cached)))
            yield "data: [DONE]\n\n"
        finally:
            for s in seqs:
                sched.cancel(s)  # the client went away (or the stream ended): free the slots

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


_MARK = "\ue000webtensor-text\ue000"  # a private-use string no JSON encoder leaves as is


def _framer(chunk: Callable[[str], dict[str, Any]]) -> Callable[[str], str]:
    """text -> the event `_data(chunk(text))`, from a template made once per stream (the JSON of a
    chunk around a marker for its text): a token's event without building and dumping a dict each
    time (the same bytes)."""
    head, tail = _data(chunk(_MARK)).split(json.dumps(_MARK), 1)
    return lambda text: head + json.dumps(text) + tail


# -- errors, auth, limits, request counts -------------------------------------------------------------
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
        msg = str(exc.detail)
        if exc.status_code in (404, 405):
            msg = f"{request.method} {request.url.path}: {msg.lower()}"
        e = APIError(exc.status_code, msg, code=None)
        return JSONResponse(e.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers or None)


class _Guard:
    """ASGI middleware: the API key, the body's limits (size, stalls), a 500 in OpenAI's shape for
    anything that raised, and a request count by route and status."""

    def __init__(self, app: ASGIApp, api_key: str | None, metrics: Metrics, max_body: int,
                 body_timeout: float, body_deadline: float = BODY_DEADLINE):
        self.app, self.api_key, self.metrics = app, api_key, metrics
        self.max_body, self.body_timeout, self.body_deadline = max_body, body_timeout, body_deadline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path: str = scope.get("path", "")
        route = path if path in _ROUTES else "/v1/models/{id}" if path.startswith("/v1/models/") else "other"
        status = {"code": 500, "started": False}

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
            await send(message)

        try:
            if self.api_key is not None and _needs_key(path) and not self._authorized(scope):
                e = APIError(401, "a valid API key is needed: send the header 'Authorization: Bearer KEY'",
                             code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                return await _error(e)(scope, receive, counting_send)
            if scope.get("method") in ("POST", "PUT", "PATCH"):
                body = await self._body(scope, receive)
                if isinstance(body, APIError):
                    return await _error(body)(scope, receive, counting_send)
                receive = _replay(body, receive)
            await self.app(scope, receive, counting_send)
        except Exception as exc:  # noqa: BLE001 - a bug must not cost the connection its answer
            log.exception("unhandled error in %s %s", scope.get("method"), path)
            if status["started"]:
                raise
            e = APIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")
            await _error(e)(scope, receive, counting_send)
        finally:
            self.metrics.requests.labels(route, str(status["code"])).inc()

    async def _body(self, scope: Scope, receive: Receive) -> bytes | APIError:
        """The whole body; or a 413 as soon as it is known to pass max_body (from its Content-Length,
        before reading any; else while reading), or a 408 when it stalls for body_timeout seconds or has not
        all come within body_deadline seconds of the request's head (a body that trickles in). The 408 closes
        the connection (its body's rest is never read); what is left unread of a 413, uvicorn discards."""
        too_large = APIError(413, f"the request body is larger than this server takes ({self.max_body} bytes; "
                             "--max-body)", code="request_too_large")
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return too_large
        parts, size = [], 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_deadline
        while True:
            left = deadline - loop.time()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, min(self.body_timeout, left)))
            except TimeoutError:
                why = f"stalled for {self.body_timeout:g} s" if left > self.body_timeout else \
                    f"took longer than {self.body_deadline:g} s to arrive (--body-timeout)"
                return APIError(408, f"the request body {why}", code="request_timeout",
                                headers={"Connection": "close"})
            if message["type"] != "http.request":  # (the client went away)
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return too_large
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(parts)

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        got = headers.get(b"authorization", b"").decode("latin-1")
        return secrets.compare_digest(got.encode("latin-1"), f"Bearer {self.api_key}".encode())


def _needs_key(path: str) -> bool:
    return path.startswith("/v1/") or path in ("/tokenize", "/detokenize", "/tokenizer_info")


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body read already, then whatever comes next (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay


_ROUTES = {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/models", "/tokenize", "/detokenize",
           "/tokenizer_info", "/health", "/metrics", "/openapi.json"}
