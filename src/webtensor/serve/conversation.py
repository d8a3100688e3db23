"""A conversation's prompt and how its answer is read, for /v1/chat/completions and /v1/responses alike.

`render(engine, messages, tools, kwargs)`: the messages through the model's chat template as transformers
renders them, `tools` (OpenAI's function definitions) passed as `tools=[{"type": "function", "function":
...}]`, an assistant's calls with their arguments as objects, tool results as `tool` messages, and the
request's `chat_template_kwargs` (`enable_thinking`, ...). A template that knows no tools (SmolLM2's, the
plain one) gets them described in a system message of the server's (`tools.system_prompt`) and the history's
calls and results written in the hermes syntax.

`Plan`: how the answer is read (`reply.ReplyParser`: <think> blocks where the template has them, tool calls in
the template's format unless tool_choice is "none"), which special tokens must stay in its text (the format's
markers), and with tool_choice "required" or a named function the llguidance grammar (`tools.grammar`) every
answer follows.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from .. import chat
from ..errors import ChatTemplateError
from . import reply as r
from . import tools as t
from .engine import Engine
from .protocol import APIError, ChatMessage


def render(engine: Engine, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None,
           kwargs: dict[str, Any] | None = None, add_generation_prompt: bool = True, param: str = "messages",
           describe_tools: bool = True) -> str:
    """The prompt (the module docstring); a conversation the template refuses is a 400 naming `param`."""
    msgs = [m.template_dict() for m in messages]
    template = engine.chat_template
    if not t.knows_tools(template):
        msgs = _hermes_history(msgs, tools if describe_tools else None)
        tools = None
    try:
        return chat.template_for(engine).render(
            msgs, add_generation_prompt=add_generation_prompt,
            tools=[{"type": "function", "function": f} for f in tools] if tools else None, **(kwargs or {}))
    except ChatTemplateError as e:  # the template's raise_exception: the conversation is refused
        raise APIError(400, f"{param}: {e}", param=param) from None


def _hermes_history(msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """For a template that knows no tools: the tools described in the system message, each assistant's calls
    as <tool_call> blocks after its text, each tool result a user turn in <tool_response> tags."""
    out = []
    for m in msgs:
        m = dict(m)
        if m.get("tool_calls"):
            blocks = [json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                                 ensure_ascii=False) for c in m.pop("tool_calls")]
            m["content"] = "\n".join([*([m["content"]] if m.get("content") else []),
                                      *(f"<tool_call>\n{b}\n</tool_call>" for b in blocks)])
        if m["role"] == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
        out.append(m)
    if tools:
        described = t.system_prompt(tools)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{described}"}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


@dataclass(frozen=True)
class Plan:
    """How one request's answers are read (the module docstring)."""

    think: bool  # the template writes <think> blocks
    inside: bool  # the prompt opened one
    fmt: t.ToolFormat | None  # parse calls in this format (None: the answer is text)
    parallel: bool
    shown: frozenset[int]  # special token ids whose text the parser must see
    grammar: str | None  # the forced calls' grammar (None: none)
    schemas: tuple[tuple[str, Any], ...] = ()  # the tools' parameters by name (the qwen3_xml parser types values)

    @property
    def plain(self) -> bool:
        """The answer is text as it comes (nothing to split or parse)."""
        return not self.think and self.fmt is None

    def parser(self) -> r.ReplyParser:
        return r.ReplyParser(self.think, self.inside, self.fmt, self.parallel, dict(self.schemas))


PLAIN = Plan(think=False, inside=False, fmt=None, parallel=True, shown=frozenset(), grammar=None)  # text as it is


class Grammars:
    """Compiled and checked grammars of forced calls, by grammar text (agents send the same tools each turn)."""

    def __init__(self, engine: Engine, size: int = 64):
        self.engine, self.size = engine, size
        self._done: OrderedDict[str, None] = OrderedDict()

    async def check(self, lark: str, param: str) -> str:
        """The llguidance grammar of `lark`, compiled and checked off the event loop (a 400 naming `param` if it
        cannot be)."""
        from . import grammar as g

        e = self.engine
        if lark in self._done:
            self._done.move_to_end(lark)
            return g.compile_lark(lark)

        def build() -> str:
            compiled = g.compile_lark(lark)
            g.check(compiled, g.grammar_tokenizer(e.tokenizer, e.vocab_size, e.eos_ids))
            return compiled
        try:
            compiled = await asyncio.to_thread(build)
        except g.GrammarError as err:
            raise APIError(400, f"{param}: {err}", param=param, code="invalid_schema") from None
        self._remember(lark)
        return compiled

    def _remember(self, key: str) -> None:
        self._done[key] = None
        if len(self._done) > self.size:
            self._done.popitem(last=False)

    async def check_schemas(self, functions: list[dict[str, Any]], param: str) -> None:
        """Each tool's `parameters` is a JSON schema llguidance compiles (a 400 naming the tool's field, `param`
        with "{}" for its index, if not): what a forced call will need, checked for every tool."""
        from . import grammar as g

        e = self.engine
        todo = [(i, json.dumps(f["parameters"], sort_keys=True)) for i, f in enumerate(functions)
                if f.get("parameters") is not None]
        todo = [(i, key) for i, key in todo if "schema:" + key not in self._done]

        def check_all() -> tuple[int, str] | None:
            for i, key in todo:
                try:
                    g.check(g.compile_format("json_schema", json.loads(key)),
                            g.grammar_tokenizer(e.tokenizer, e.vocab_size, e.eos_ids))
                except g.GrammarError as err:
                    return i, str(err)
            return None
        bad = await asyncio.to_thread(check_all) if todo else None
        if bad is not None:
            where = param.format(bad[0])
            raise APIError(400, f"{where}: {bad[1]}", param=where, code="invalid_schema")
        for _, key in todo:
            self._remember("schema:" + key)


def special_ids(engine: Engine, texts: tuple[str, ...]) -> dict[str, int]:
    """The texts among `texts` that are special tokens of the engine's tokenizer: text -> id."""
    tok = engine.tokenizer
    to_id, is_special = getattr(tok, "token_to_id", None), getattr(tok, "is_special", None)
    if to_id is None or is_special is None:
        return {}
    out = {}
    for s in texts:
        i = to_id(s)
        if i is not None and 0 <= i < engine.vocab_size and is_special(i):
            out[s] = i
    return out


async def plan(engine: Engine, grammars: Grammars, prompt: str, functions: list[dict[str, Any]], choice: str,
               parallel: bool, params_param: str) -> Plan:
    """The request's Plan (`choice`: "none", "auto", "required" or a function's name; `params_param`: how its
    tools' schemas are named in errors, "{}" the tool's index)."""
    template = engine.chat_template
    think = r.thinks(template)
    inside = think and r.starts_thinking(prompt)
    fmt = t.format_for(template)
    calls = bool(functions) and choice != "none"
    # (the markers the parser reads stay in the text; a call's, only where calls are read)
    special = special_ids(engine, (*(fmt.markers if calls else ()), *((r.THINK_OPEN, r.THINK_CLOSE) if think else ())))
    grammar = None
    if calls:
        await grammars.check_schemas(functions, params_param)
    if calls and choice != "auto":
        chosen = functions if choice == "required" else [f for f in functions if f["name"] == choice]
        mode: Literal["no", "open", "inside"] = "inside" if inside else \
            "open" if think and not prompt.rstrip().endswith(r.THINK_CLOSE) else "no"
        grammar = await grammars.check(t.grammar(fmt, chosen, parallel, special, mode), "tool_choice")
    return Plan(think, inside, fmt if calls else None, parallel, frozenset(special.values()), grammar,
                tuple((f["name"], f.get("parameters") or {}) for f in functions))
