"""The Responses API's answers (/v1/responses; the route itself is in app.py, beside chat's, whose prompt, sequence
and reading of the answer it shares): the Response object, whole or as OpenAI streams it.

The output items, in order: a `reasoning` item (the <think> block's text as one `reasoning_text` part) where the
model reasoned, the `message` (its one `output_text` part) where it wrote text (or called nothing), and one
`function_call` item a call (`call_id`, `name`, `arguments`).

A stream is server-sent events, each `event: TYPE` and `data: {json}` carrying `type` and `sequence_number`
(0, 1, ...): response.created and response.in_progress (the response, in_progress, no output yet); then per
item as the answer reaches it: response.output_item.added; for the reasoning response.reasoning_text.delta...
and response.reasoning_text.done; for the message response.content_part.added (an empty output_text),
response.output_text.delta... , response.output_text.done and response.content_part.done; for a call
response.function_call_arguments.delta... and response.function_call_arguments.done; then
response.output_item.done; at the end response.completed (or response.incomplete, where max_output_tokens or
the context ended it). There is no `data: [DONE]` (OpenAI sends none for this API). An error mid-stream is an
`error` event followed by response.failed, and ends the stream.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from .conversation import PLAIN, Plan
from .protocol import (
    APIError,
    FunctionCallOutput,
    IncompleteDetails,
    InputTokensDetails,
    OutputMessage,
    OutputText,
    ReasoningOutput,
    ResponseErrorInfo,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from .reply import Delta
from .scheduler import Generation, Scheduler

Status = Literal["in_progress", "completed", "incomplete", "failed"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class Reply:
    """One request's Response: its ids and time, the request's settings it echoes, and its output items."""

    def __init__(self, body: ResponsesRequest, model: str, seq: Generation, plan: Plan = PLAIN):
        self.body, self.model, self.seq, self.plan = body, model, seq, plan
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())

    def usage(self) -> ResponseUsage:
        seq = self.seq
        return ResponseUsage(input_tokens=len(seq.prompt), output_tokens=seq.streamed,
                             total_tokens=len(seq.prompt) + seq.streamed,
                             input_tokens_details=InputTokensDetails(cached_tokens=seq.reused))

    def response(self, status: Status, output: list[Any] | None = None, error: APIError | None = None
                 ) -> dict[str, Any]:
        """The Response: in_progress (no output, no usage yet), completed / incomplete (the output items, and
        usage) or failed (`error`)."""
        b = self.body
        fmt = b.text.format if b.text and b.text.format else None
        text_param: dict[str, Any] = {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt
                                      else {"type": "text"}}
        if b.text and b.text.verbosity:
            text_param["verbosity"] = b.text.verbosity
        ended = status in ("completed", "incomplete", "failed")
        err = None if error is None else ResponseErrorInfo(
            code="server_error" if error.status >= 500 else "invalid_prompt", message=error.message)
        choice = b.tool_choice.model_dump() if isinstance(b.tool_choice, BaseModel) else (b.tool_choice or "auto")
        resp = ResponseObject(
            id=self.id, created_at=self.created_at, status=status,
            completed_at=int(time.time()) if status == "completed" else None, error=err,
            incomplete_details=IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None,
            instructions=b.instructions, max_output_tokens=b.max_output_tokens, model=self.model,
            output=output if status in ("completed", "incomplete") and output is not None else [],
            parallel_tool_calls=True if b.parallel_tool_calls is None else b.parallel_tool_calls,
            reasoning=b.reasoning.model_dump() if b.reasoning else None,
            temperature=1.0 if b.temperature is None else b.temperature, top_p=1.0 if b.top_p is None else b.top_p,
            text=text_param, tool_choice=choice, metadata=b.metadata or {},
            tools=[{**t.model_dump(exclude_none=True), "strict": bool(t.strict), "parameters": t.parameters}
                   for t in b.tools or []],  # (the spec's FunctionTool: strict and parameters always there)
            usage=self.usage() if ended and error is None else None)
        return resp.model_dump(exclude={"usage"} if resp.usage is None else None)  # (the spec's usage: no null)

    def whole(self, text: str, finish: str) -> dict[str, Any]:
        status = _status(finish)
        answer = self.plan.parser().whole(text) if not self.plan.plain else None
        items: list[Any] = []
        if answer is not None and answer.reasoning is not None:
            items.append(_reasoning(f"rs_{uuid.uuid4().hex}", status, answer.reasoning))
        body = text if answer is None else answer.content
        if body is not None or answer is None or not answer.calls:
            items.append(_message(f"msg_{uuid.uuid4().hex}", status, body or ""))
        for c in answer.calls if answer is not None else []:  # (a call that parsed is whole)
            items.append(_call(f"fc_{uuid.uuid4().hex}", c.id, c.name, c.arguments, "completed"))
        return self.response(status, [i.model_dump() for i in items])


def _message(item_id: str, status: ItemStatus, text: str | None) -> OutputMessage:
    """The output message: its one output_text part (none while it is only begun)."""
    return OutputMessage.model_validate({"id": item_id, "status": status,
                                         "content": [] if text is None else [OutputText(text=text)]})


def _reasoning(item_id: str, status: ItemStatus, text: str | None) -> ReasoningOutput:
    return ReasoningOutput(id=item_id, status=status,
                           content=[] if text is None else [{"type": "reasoning_text", "text": text}])


def _call(item_id: str, call_id: str, name: str, arguments: str, status: ItemStatus) -> FunctionCallOutput:
    return FunctionCallOutput(id=item_id, call_id=call_id, name=name, arguments=arguments, status=status)


def _status(finish: str) -> Literal["completed", "incomplete"]:
    """A sequence's finish reason as the Response's status: "length" (max_output_tokens, or the context's end)
    leaves it incomplete."""
    return "incomplete" if finish == "length" else "completed"


class _Items:
    """The stream's output items as the answer reaches them (the module docstring): `event` makes each
    server-sent event; `to(kind)` closes the open item unless it is of `kind` and opens one of it."""

    def __init__(self, event: Any):
        self.event = event
        self.done: list[Any] = []  # closed items (their final form)
        self.kind: str | None = None  # the open item's kind
        self.item_id = ""
        self.text = ""  # the open item's text (or arguments)
        self.call: dict[str, Any] = {}  # the open call's id and name

    def _where(self, content: bool = True) -> dict[str, Any]:
        out = {"item_id": self.item_id, "output_index": len(self.done)}
        return {**out, "content_index": 0} if content else out

    def to(self, kind: str, status: ItemStatus = "completed", **call: Any) -> list[str]:
        if self.kind == kind and kind != "function_call":
            return []
        out = self.close(status)
        self.kind, self.text, self.call = kind, "", call
        prefix = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind]
        self.item_id = f"{prefix}_{uuid.uuid4().hex}"
        out.append(self.event("response.output_item.added", output_index=len(self.done),
                              item=self._item("in_progress", final=False).model_dump()))
        if kind == "message":
            out.append(self.event("response.content_part.added", **self._where(), part=_part("")))
        return out

    def _item(self, status: ItemStatus, final: bool = True) -> Any:
        if self.kind == "reasoning":
            return _reasoning(self.item_id, status, self.text if final else None)
        if self.kind == "message":
            return _message(self.item_id, status, self.text if final else None)
        return _call(self.item_id, self.call["call_id"], self.call["name"], self.text, status)

    def add(self, piece: str) -> list[str]:
        """More text for the open item."""
        if not piece:
            return []
        self.text += piece
        kind = {"reasoning": "response.reasoning_text.delta", "message": "response.output_text.delta",
                "function_call": "response.function_call_arguments.delta"}[str(self.kind)]
        extra: dict[str, Any] = {"logprobs": []} if self.kind == "message" else {}
        return [self.event(kind, **self._where(self.kind != "function_call"), delta=piece, **extra)]

    def close(self, status: ItemStatus) -> list[str]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "reasoning":
            out.append(self.event("response.reasoning_text.done", **self._where(), text=self.text))
        elif self.kind == "message":
            out.append(self.event("response.output_text.done", **self._where(), text=self.text, logprobs=[]))
            out.append(self.event("response.content_part.done", **self._where(), part=_part(self.text)))
        else:
            out.append(self.event("response.function_call_arguments.done", **self._where(False),
                                  name=self.call["name"], arguments=self.text))
        item = self._item(status).model_dump()
        out.append(self.event("response.output_item.done", output_index=len(self.done), item=item))
        self.done.append(item)
        self.kind = None
        return out


def _part(text: str) -> dict[str, Any]:
    return OutputText(text=text).model_dump()


def stream(sched: Scheduler, reply: Reply) -> StreamingResponse:
    """The Response as OpenAI streams it (the module docstring); the slot is freed however the stream ends."""
    seq, number = reply.seq, 0

    def event(type_: str, **fields: Any) -> str:
        nonlocal number
        obj = {"type": type_, **fields, "sequence_number": number}
        number += 1
        return f"event: {type_}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n"

    parser = reply.plan.parser() if not reply.plan.plain else None
    items = _Items(event)

    def deltas(d: Delta) -> list[str]:
        out = []
        if d.reasoning:
            out += items.to("reasoning") + items.add(d.reasoning)
        if d.content:
            out += items.to("message") + items.add(d.content)
        for c in d.calls:
            if "id" in c:
                out += items.to("function_call", call_id=c["id"], name=c["function"]["name"])
            out += items.add(c["function"]["arguments"])
        return out

    async def events() -> AsyncIterator[str]:
        try:
            yield event("response.created", response=reply.response("in_progress"))
            yield event("response.in_progress", response=reply.response("in_progress"))
            if parser is None:
                for line in items.to("message"):
                    yield line
            finish, error = None, None
            async for ev in seq.stream():
                if ev.error is not None:
                    error = ev.error
                    break
                d = Delta(content=ev.text) if parser is None else parser.feed(ev.text)
                if ev.finish is not None and parser is not None:
                    d.extend(parser.finish())
                for line in deltas(d):
                    yield line
                if ev.finish is not None:
                    finish = ev.finish
                    break
            if finish is None:
                e = error or APIError(500, "the sequence ended without a finish reason")
                yield event("error", code=e.code, message=e.message, param=e.param)
                yield event("response.failed", response=reply.response("failed", error=e))
                return
            status = _status(finish)
            if not any(i["type"] in ("message", "function_call") for i in items.done) and items.kind in \
                    (None, "reasoning"):
                for line in items.to("message", status):  # (an answer of no text still has its message)
                    yield line
            for line in items.close(status):
                yield line
            yield event(f"response.{status}", response=reply.response(status, items.done))
        finally:
            sched.cancel(seq)  # the client went away (or the stream ended): free the slot

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
