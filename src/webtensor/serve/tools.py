"""Tool calling: how a model writes a function call (one `ToolFormat` per family, chosen from its chat
template), the call ids, the description of tools for a template that knows none, and the llguidance grammar
that makes every answer a valid call (`tool_choice` "required" or a named function); the parser that turns an
answer into OpenAI's `tool_calls` is tool_parser.py.

Formats (`format_for(template)`; the template itself tells the model the syntax, with the tools it was given):

- `hermes`: Hermes 2/3, Qwen2.5, Qwen3, QwQ (the template writes `<tool_call>`): anywhere in the answer,
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block a call.
- `qwen3_xml`: Qwen3-Coder, Qwen3.5 (`<function=` in `<tool_call>`): `<tool_call>\\n<function=NAME>\\n` then one
  `<parameter=KEY>\\nVALUE\\n</parameter>\\n` an argument, `</function>\\n</tool_call>`; a value is text for a
  string parameter and JSON for the others (by the tool's schema), so the parser is given the tools' schemas.
- `llama3_json`: Llama 3.1 / 3.2 / 3.3 (the template writes `<|python_tag|>` or asks for a JSON
  `{"name": ..., "parameters": {...}}`): the answer is the call, a JSON object (`<|python_tag|>` may come first;
  several are separated by `;`), "parameters" or "arguments".
- `mistral`: Mistral v3 templates (Mistral 7B v0.3, Nemo; `[TOOL_CALLS][`): `[TOOL_CALLS]` and a JSON array of
  `{"name", "arguments"}`.
- `mistral_args`: newer Mistral templates (Small 3.2, Devstral; `[ARGS]`): `[TOOL_CALLS]name[ARGS]{...}` a call.
- `plain`: a template that knows no tools (SmolLM2, GPT-2's plain one): the server describes the tools in a
  system message of its own (`system_prompt`) and the model answers in the hermes syntax.

The parser of these formats is tool_parser.py.

`grammar(...)`: the format's call syntax around each tool's `parameters` JSON schema (its name a constant),
one call or several (`parallel_tool_calls`), compact JSON, then only the end of the answer; a reasoning model
may first finish its thinking (`think`).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

FORMATS = ("hermes", "qwen3_xml", "llama3_json", "mistral", "mistral_args", "plain")
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's rule ([a-zA-Z0-9_-], 64 at most) and dots


@dataclass(frozen=True)
class ToolFormat:
    """How one family writes calls: `name` (FORMATS), the marker that begins a call (`open`; None: the answer
    itself, llama3_json's JSON at its start), the one that ends it (`close`), the key of the arguments, and the
    markers whose special tokens must stay in the decoded text for the parser to see them."""

    name: str
    open: str | None
    close: str | None
    args_key: str
    markers: tuple[str, ...]

    @property
    def call_ids(self) -> Literal["call", "mistral"]:
        """Mistral's templates refuse a call id that is not 9 letters and digits."""
        return "mistral" if self.name.startswith("mistral") else "call"


_FORMATS = {
    "hermes": ToolFormat("hermes", "<tool_call>", "</tool_call>", "arguments", ("<tool_call>", "</tool_call>")),
    "plain": ToolFormat("plain", "<tool_call>", "</tool_call>", "arguments", ("<tool_call>", "</tool_call>")),
    "qwen3_xml": ToolFormat("qwen3_xml", "<tool_call>", "</tool_call>", "arguments", ("<tool_call>", "</tool_call>")),
    "llama3_json": ToolFormat("llama3_json", None, None, "parameters", ("<|python_tag|>",)),
    "mistral": ToolFormat("mistral", "[TOOL_CALLS]", None, "arguments", ("[TOOL_CALLS]",)),
    "mistral_args": ToolFormat("mistral_args", "[TOOL_CALLS]", None, "arguments",
                               ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")),
}


def get_format(name: str) -> ToolFormat:
    return _FORMATS[name]


def format_for(template: str | None) -> ToolFormat:
    """The call syntax a chat template teaches its model (the module docstring), from the template's text."""
    t = template or ""
    if "[TOOL_CALLS]" in t:
        return _FORMATS["mistral_args" if "[ARGS]" in t else "mistral"]
    if "<tool_call>" in t:
        return _FORMATS["qwen3_xml" if "<function=" in t and "<parameter=" in t else "hermes"]
    if "<|python_tag|>" in t or ("<|start_header_id|>" in t and "tools" in t):
        return _FORMATS["llama3_json"]
    return _FORMATS["plain"]


def knows_tools(template: str | None) -> bool:
    """Whether the template renders the `tools` it is given (else the server describes them itself)."""
    return template is not None and format_for(template).name != "plain"


def system_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """For a template that knows no tools: the system text that describes `tools` (OpenAI's function
    definitions, compact JSON) and the hermes call syntax, in few tokens (small models, short contexts)."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False, separators=(",", ":")) for t in tools)
    return (f"You may call these functions:\n{lines}\nTo call one, answer:\n<tool_call>\n"
            '{"name": <function name>, "arguments": <arguments object>}\n</tool_call>')


def new_call_id(fmt: ToolFormat) -> str:
    """A call's id: `call_` and 24 hex digits (OpenAI's form), or for Mistral's templates 9 letters and digits."""
    if fmt.call_ids == "mistral":
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
    return f"call_{secrets.token_hex(12)}"


def is_text(schema: dict[str, Any]) -> bool:
    """Whether a qwen3_xml parameter's value is written as plain text: a string, or an enum of strings."""
    kind = schema.get("type")
    return kind == "string" or (kind is None and bool(schema.get("enum"))
                                and all(isinstance(e, str) for e in schema["enum"]))



# -- grammar ---------------------------------------------------------------------------------------------
def closed(schema: Any) -> Any:
    """`schema` with every object that does not say otherwise closed to the properties it lists
    (`additionalProperties: false`, as xgrammar's strict mode reads schemas in vLLM): a forced call names the
    tool's parameters alone, and a random model cannot wander off in keys nobody asked for."""
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (closed(v) if k in ("items", "prefixItems", "anyOf", "oneOf", "allOf", "not", "if", "then", "else")
               else {n: closed(x) for n, x in v.items()} if k in ("properties", "$defs", "definitions",
                                                                 "patternProperties") and isinstance(v, dict)
               else v) for k, v in schema.items()}
    is_object = out.get("type") == "object" or (isinstance(out.get("type"), list) and "object" in out["type"]) \
        or "properties" in out
    if is_object and "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    return out


def call_schema(fmt: ToolFormat, tool: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of one call of `tool` (an OpenAI function definition) in `fmt`'s JSON: its name a
    constant, its arguments the tool's `parameters` (none: an object without properties), `closed`."""
    params: dict[str, Any] = closed(tool.get("parameters") or {"type": "object", "properties": {}})
    if fmt.name == "mistral_args":
        return params
    return {"type": "object", "properties": {"name": {"const": tool["name"]}, fmt.args_key: params},
            "required": ["name", fmt.args_key], "additionalProperties": False}


def grammar(fmt: ToolFormat, tools: Sequence[dict[str, Any]], parallel: bool, special: dict[str, int],
            think: Literal["no", "open", "inside"] = "no") -> str:
    """The llguidance (lark) grammar of an answer that is calls of `tools` alone (one, or with `parallel` one or
    more), in `fmt`'s syntax. `special`: the format's markers that are special tokens in this tokenizer (text ->
    id: written as that token). `think`: "inside" the answer begins inside a thinking block (the prompt opened
    it), "open" it may begin with one, "no" neither."""
    def lit(s: str) -> str:
        return f"<[{special[s]}]>" if s in special else json.dumps(s)

    def js(schema: dict[str, Any]) -> str:
        return "%json " + json.dumps({**schema, "x-guidance": {"whitespace_flexible": False}})

    rules = []
    if fmt.name == "qwen3_xml":
        for i, tool in enumerate(tools):
            rules += _xml_rules(i, tool, js, lit)
        rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(tools))))
        calls = 'call ("\\n" call)*' if parallel else "call"
    elif fmt.name == "mistral_args":
        alts = [f"call_{i}" for i in range(len(tools))]
        for i, tool in enumerate(tools):
            rules.append(f"call_{i}: {lit('[TOOL_CALLS]')} {json.dumps(tool['name'])} {lit('[ARGS]')} "
                         f"{js(call_schema(fmt, tool))}")
        rules.append("call: " + " | ".join(alts))
        calls = "call+" if parallel else "call"
    else:
        body = js({"anyOf": [call_schema(fmt, t) for t in tools]}) if len(tools) > 1 else \
            js(call_schema(fmt, tools[0]))
        rules.append(f"obj: {body}")
        if fmt.name in ("hermes", "plain"):
            rules.append(f"call: {lit('<tool_call>')} \"\\n\" obj \"\\n\" {lit('</tool_call>')}")
            calls = 'call ("\\n" call)*' if parallel else "call"
        elif fmt.name == "llama3_json":
            rules.append("call: obj")
            calls = 'call ("; " call)*' if parallel else "call"
        else:  # mistral
            rules.append("call: obj")
            calls = f'{lit("[TOOL_CALLS]")} "[" call (", " call)* "]"' if parallel else \
                f'{lit("[TOOL_CALLS]")} "[" call "]"'
    head = {"no": "", "open": "(think_open think_rest)? ", "inside": "think_rest "}[think]
    lines = ["%llguidance {}", f"start: {head}calls", f"calls: {calls}", *rules]
    if think != "no":  # (text up to </think>: a special token after any text, or the text's first </think>)
        body = f"THINK {lit('</think>')}" if "</think>" in special else "thought"
        lines += [f"think_open: {lit('<think>')}", f"think_rest: {body} BLANK", "THINK: /(.|\\n)*/",
                  "thought[lazy]: /(.|\\n)*<\\/think>/", "BLANK: /[ \\n]*/"]
    return "\n".join(lines) + "\n"


def _xml_rules(i: int, tool: dict[str, Any], js: Any, lit: Any) -> list[str]:
    """qwen3_xml: the rules of one call of `tool`: its parameters in the schema's order (the required ones
    always, the others optional), a string's value as text (of at most maxLength characters, or one of its enum),
    any other value as JSON valid by its schema."""
    params = closed(tool.get("parameters") or {"type": "object", "properties": {}})
    props = params.get("properties") or {}
    required = set(params.get("required") or ())
    rules, parts = [], []
    for j, (key, schema) in enumerate(props.items()):
        rule = f"p_{i}_{j}"
        head = json.dumps(f"<parameter={key}>\n")
        tail = json.dumps("\n</parameter>\n")
        schema = schema if isinstance(schema, dict) else {}
        if is_text(schema) and "enum" in schema:
            rules.append(f"{rule}: {head} ({' | '.join(json.dumps(str(e)) for e in schema['enum'])}) {tail}")
        elif is_text(schema):
            n = schema.get("maxLength")
            count = f"{{0,{int(n)}}}" if isinstance(n, int) else "*"
            rules.append(f"{rule}: {head} v_{i}_{j}")
            rules.append(f"v_{i}_{j}[lazy]: /(?s:.{count})\\n<\\/parameter>\\n/")
        else:
            rules.append(f"{rule}: {head} {js(schema)} {tail}")
        parts.append(rule if key in required else f"{rule}?")
    body = " ".join(parts)
    opening = json.dumps("\n<function=" + tool["name"] + ">\n")
    closing = json.dumps("</function>\n")
    rules.append(f"call_{i}: {lit('<tool_call>')} {opening} {body} {closing} {lit('</tool_call>')}")
    return rules
