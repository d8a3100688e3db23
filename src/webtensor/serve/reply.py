"""An assistant's answer as the APIs give it: its reasoning (`<think>...</think>`), its text and its tool calls,
whole or as a stream of deltas.

Reasoning: a model whose chat template writes `<think>` (Qwen3, QwQ, DeepSeek-R1, SmolLM3) thinks in a
`<think>...</think>` block at the start of its answer; the block's text is the reasoning (vLLM's
`reasoning_content`), what follows it (its leading blank lines dropped) the content. A template may open the
block itself (the prompt ends inside it: `starts_thinking`), so the answer begins with the reasoning and has
only the closing tag; an answer that never closes its block is all reasoning.

Tool calls: the rest of the answer goes through the format's `tool_parser.CallParser` (where the request has tools
and `tool_choice` is not "none").

`ReplyParser.feed(text)` / `finish()` give `Delta`s (reasoning, content, call pieces: a call's first piece
carries its index, id and name, the next ones pieces of its arguments); `whole(text)` gives the `Reply`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from . import tool_parser as tp
from . import tools as t
from .textstream import partial_suffix

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def thinks(template: str | None) -> bool:
    """Whether a chat template's model writes its reasoning in <think> blocks."""
    return template is not None and THINK_OPEN in template and THINK_CLOSE in template


def starts_thinking(prompt: str) -> bool:
    """Whether a rendered prompt ends inside a <think> block (the template opened it for the answer)."""
    return prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)


class ThinkSplitter:
    """The answer's text as it comes, split into reasoning and content (the module docstring)."""

    def __init__(self, inside: bool):
        self.state: Literal["start", "inside", "after", "content"] = "inside" if inside else "start"
        self.buf = ""
        self.opened = inside  # a <think> block was there (even an empty one)

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning, content) that may be given out now."""
        self.buf += text
        reasoning = content = ""
        while True:
            before = (self.state, len(self.buf))
            if self.state == "start":
                s = self.buf.lstrip()
                if s.startswith(THINK_OPEN):
                    self.buf, self.state, self.opened = s[len(THINK_OPEN):], "inside", True
                elif final or (s and not THINK_OPEN.startswith(s)):
                    self.state = "content"
            elif self.state == "inside":
                i = self.buf.find(THINK_CLOSE)
                if i >= 0:
                    reasoning += self.buf[:i]
                    self.buf, self.state = self.buf[i + len(THINK_CLOSE):], "after"
                else:
                    keep = 0 if final else partial_suffix(self.buf, THINK_CLOSE)
                    reasoning += self.buf[:len(self.buf) - keep]
                    self.buf = self.buf[len(self.buf) - keep:]
            elif self.state == "after":
                s = self.buf.lstrip()
                if s or final:
                    self.buf, self.state = s, "content"
            else:
                content += self.buf
                self.buf = ""
            if (self.state, len(self.buf)) == before:
                return reasoning, content


@dataclass
class Reply:
    """A whole answer: reasoning (None: none), content (None: only calls) and tool calls."""

    reasoning: str | None
    content: str | None
    calls: list[tp.ToolCall] = field(default_factory=list)


@dataclass
class Delta:
    """What a stream's next chunk carries (each part may be empty)."""

    reasoning: str = ""
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's ChatCompletionMessageToolCallChunk

    def extend(self, more: Delta) -> None:
        """`more` after this (a call's pieces joined into one entry by index)."""
        self.reasoning += more.reasoning
        self.content += more.content
        for c in more.calls:
            last = self.calls[-1] if self.calls else None
            if last is not None and last["index"] == c["index"] and "id" not in c:
                last["function"]["arguments"] += c["function"]["arguments"]
            else:
                self.calls.append(c)


class ReplyParser:
    """One answer's parts (the module docstring). `think`: split <think> blocks (`inside`: the prompt opened
    one); `fmt`: parse tool calls in that format (None: the content is text); `parallel` False: the first call
    alone; `schemas`: the tools' parameters by name (tool_parser.CallParser's)."""

    def __init__(self, think: bool, inside: bool, fmt: t.ToolFormat | None, parallel: bool = True,
                 schemas: dict[str, Any] | None = None):
        self.think = ThinkSplitter(inside) if think else None
        self.fmt, self.parallel, self.schemas = fmt, parallel, schemas
        self.calls = tp.CallParser(fmt, schemas) if fmt is not None else None
        self.started = 0  # calls begun in the stream
        self._dropping = False  # the pieces of a call past the first (parallel false)

    def feed(self, text: str) -> Delta:
        return self._step(text, final=False)

    def finish(self) -> Delta:
        return self._step("", final=True)

    def _step(self, text: str, final: bool) -> Delta:
        reasoning, content = self.think.feed(text, final) if self.think is not None else ("", text)
        if self.calls is None:
            return Delta(reasoning, content)
        pieces = self.calls.feed(content)
        if final:
            pieces += self.calls.finish()
        out = Delta(reasoning)
        for p in pieces:
            if p.kind == "text":
                out.content += p.text
            elif p.kind == "start":
                self._dropping = not self.parallel and self.started >= 1
                if not self._dropping:
                    assert self.fmt is not None
                    out.calls.append({"index": self.started, "id": t.new_call_id(self.fmt), "type": "function",
                                      "function": {"name": p.name, "arguments": ""}})
                    self.started += 1
            elif p.kind == "args" and not self._dropping:
                last = out.calls[-1] if out.calls and out.calls[-1]["index"] == self.started - 1 else None
                if last is None:
                    out.calls.append({"index": self.started - 1, "function": {"arguments": p.text}})
                else:
                    last["function"]["arguments"] += p.text
        return out

    def whole(self, text: str) -> Reply:
        """The answer `text`, whole: calls that are not valid stay text."""
        reasoning: str | None = None
        content = text
        if self.think is not None:
            reasoning, content = self.think.feed(text, final=True)
            reasoning = reasoning if self.think.opened else None
        if self.fmt is None:  # (after a reasoning block, no text is no content)
            return Reply(reasoning, content if content or reasoning is None else None)
        parsed = tp.parse(self.fmt, content, self.parallel, self.schemas)
        body: str | None = parsed.content
        if (parsed.calls or reasoning is not None) and not (body or "").strip():
            body = None
        return Reply(reasoning, body, parsed.calls)
