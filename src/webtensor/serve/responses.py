"""The Responses API's answers (/v1/responses; the route itself is in app.py, beside chat's, whose prompt and
sequence it shares): the Response object, whole or as OpenAI streams it.

A stream is server-sent events, each `event: TYPE` and `data: {json}` carrying `type` and `sequence_number`
(0, 1, ...): response.created and response.in_progress (the response, in_progress, no output yet),
response.output_item.added (the message, in_progress, empty), response.content_part.added (an empty
output_text), one response.output_text.delta per piece of text, then response.output_text.done (the whole
text), response.content_part.done, response.output_item.done and response.completed (or response.incomplete,
where max_output_tokens or the context ended it). There is no `data: [DONE]` (OpenAI sends none for this
API). An error mid-stream is an `error` event followed by response.failed, and ends the stream.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi.responses import StreamingResponse

from .protocol import (
    APIError,
    IncompleteDetails,
    InputTokensDetails,
    OutputMessage,
    OutputText,
    ResponseErrorInfo,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from .scheduler import Generation, Scheduler

Status = Literal["in_progress", "completed", "incomplete", "failed"]


class Reply:
    """One request's Response: its ids and time, and the request's settings it echoes."""

    def __init__(self, body: ResponsesRequest, model: str, seq: Generation):
        self.body, self.model, self.seq = body, model, seq
        self.id, self.item_id = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
        self.created_at = int(time.time())

    def item(self, status: Status, text: str | None) -> OutputMessage:
        """The output message: its one output_text part (none while it is only begun)."""
        return OutputMessage.model_validate({"id": self.item_id, "status": status,
                                             "content": [] if text is None else [OutputText(text=text)]})

    def usage(self) -> ResponseUsage:
        seq = self.seq
        return ResponseUsage(input_tokens=len(seq.prompt), output_tokens=seq.streamed,
                             total_tokens=len(seq.prompt) + seq.streamed,
                             input_tokens_details=InputTokensDetails(cached_tokens=seq.reused))

    def response(self, status: Status, text: str | None = None, error: APIError | None = None) -> dict[str, Any]:
        """The Response: in_progress (no output, no usage yet), completed / incomplete (the message whose text
        is `text`, and usage) or failed (`error`)."""
        b = self.body
        fmt = b.text.format if b.text and b.text.format else None
        text_param: dict[str, Any] = {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt
                                      else {"type": "text"}}
        if b.text and b.text.verbosity:
            text_param["verbosity"] = b.text.verbosity
        ended = status in ("completed", "incomplete", "failed")
        out = [self.item(status, text)] if status in ("completed", "incomplete") and text is not None else []
        err = None if error is None else ResponseErrorInfo(
            code="server_error" if error.status >= 500 else "invalid_prompt", message=error.message)
        resp = ResponseObject(
            id=self.id, created_at=self.created_at, status=status,
            completed_at=int(time.time()) if status == "completed" else None, error=err,
            incomplete_details=IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None,
            instructions=b.instructions, max_output_tokens=b.max_output_tokens, model=self.model, output=out,
            parallel_tool_calls=True if b.parallel_tool_calls is None else b.parallel_tool_calls,
            temperature=1.0 if b.temperature is None else b.temperature, top_p=1.0 if b.top_p is None else b.top_p,
            text=text_param, tool_choice=b.tool_choice or "auto", metadata=b.metadata or {},
            usage=self.usage() if ended and error is None else None)
        return resp.model_dump(exclude={"usage"} if resp.usage is None else None)  # (the spec's usage: no null)

    def whole(self, text: str, finish: str) -> dict[str, Any]:
        return self.response(_status(finish), text)


def _status(finish: str) -> Literal["completed", "incomplete"]:
    """A sequence's finish reason as the Response's status: "length" (max_output_tokens, or the context's end)
    leaves it incomplete."""
    return "incomplete" if finish == "length" else "completed"


def stream(sched: Scheduler, reply: Reply) -> StreamingResponse:
    """The Response as OpenAI streams it (the module's docstring); the slot is freed however the stream ends."""
    seq, number = reply.seq, 0

    def event(type_: str, **fields: Any) -> str:
        nonlocal number
        obj = {"type": type_, **fields, "sequence_number": number}
        number += 1
        return f"event: {type_}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n"

    def part(text: str) -> dict[str, Any]:
        return OutputText(text=text).model_dump()

    where = {"item_id": reply.item_id, "output_index": 0, "content_index": 0}

    async def events() -> AsyncIterator[str]:
        try:
            yield event("response.created", response=reply.response("in_progress"))
            yield event("response.in_progress", response=reply.response("in_progress"))
            yield event("response.output_item.added", output_index=0,
                        item=reply.item("in_progress", None).model_dump())
            yield event("response.content_part.added", **where, part=part(""))
            pieces: list[str] = []
            finish, error = None, None
            async for ev in seq.stream():
                if ev.error is not None:
                    error = ev.error
                    break
                if ev.text:
                    pieces.append(ev.text)
                    yield event("response.output_text.delta", **where, delta=ev.text, logprobs=[])
                if ev.finish is not None:
                    finish = ev.finish
                    break
            if finish is None:
                e = error or APIError(500, "the sequence ended without a finish reason")
                yield event("error", code=e.code, message=e.message, param=e.param)
                yield event("response.failed", response=reply.response("failed", error=e))
                return
            text, status = "".join(pieces), _status(finish)
            yield event("response.output_text.done", **where, text=text, logprobs=[])
            yield event("response.content_part.done", **where, part=part(text))
            yield event("response.output_item.done", output_index=0, item=reply.item(status, text).model_dump())
            yield event(f"response.{status}", response=reply.response(status, text))
        finally:
            sched.cancel(seq)  # the client went away (or the stream ended): free the slot

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
