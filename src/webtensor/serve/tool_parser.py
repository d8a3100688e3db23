"""The tool-call parser: a model's answer, whole or as it comes, as text and calls in its family's format
(`tools.ToolFormat`; the formats are described in tools.py).

`CallParser(format)` reads the answer's text as it comes (`feed`, `finish`) and gives `Piece`s in order: text,
a call's start (its name, once the name is whole), pieces of its arguments (the model's own JSON text, so the
pieces joined are the whole call's `arguments`; qwen3_xml: each argument whole, as JSON), and a call's end
(valid or not). A call must be a JSON object with a string "name" and an object as its arguments; one that is
not (malformed JSON, a missing name, the answer cut mid-call) is text where it stands when the answer is parsed
whole (`parse`); a stream cannot take back a call it began, so there it stays a call with the arguments streamed.
Text that could begin a call, and blanks before and after calls, are held back until it is known what they are.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from .textstream import partial_suffix
from .tools import FUNCTION_NAME, ToolFormat, is_text, new_call_id


@dataclass
class Piece:
    """One thing the parser found, in order: `text`; a call's `start` (its `name`); an `args` piece of the call
    being read; a call's `end` (`ok`: a valid call, `raw`: the call's whole text as the model wrote it,
    `arguments`: its arguments' JSON text)."""

    kind: Literal["text", "start", "args", "end"]
    text: str = ""
    name: str = ""
    ok: bool = False
    raw: str = ""


class _Json:
    """One JSON value read a character at a time: whether it is still a valid beginning (`bad`), whether it is
    whole (`done`), and for an object its top-level members as they come (key -> [start, end) of the raw value in
    `text`; end None while the value is being read). Literals are checked by their characters only: a whole
    value is checked again by `json.loads`."""

    _SCALAR = set("0123456789+-.eEtrufalsn")

    def __init__(self) -> None:
        self.text = ""
        self.stack: list[str] = []  # open containers: "{" / "["
        self.in_str = self.esc = self.done = self.bad = False
        self.members: dict[str, list[int | None]] = {}
        self._top = "value"  # in the outer object: key / colon / value / comma
        self._key_start = 0
        self._key: str | None = None
        self._scalar = False  # reading a top-level member's scalar value (ends at , or })

    def push(self, s: str) -> int:
        """Read `s`; how many of its characters belong to the value (the rest follows it)."""
        for i, c in enumerate(s):
            if self.done or self.bad:
                return i
            self._char(c)
            if self.done:
                return i + 1
        return len(s)

    def _char(self, c: str) -> None:
        pos = len(self.text)
        self.text += c
        depth = len(self.stack)
        outer = depth == 1 and self.stack[0] == "{"  # (in the outer object itself)
        if self.in_str:
            if self.esc:
                self.esc = False
            elif c == "\\":
                self.esc = True
            elif c == '"':
                self.in_str = False
                if outer and self._top == "key":
                    try:
                        self._key = json.loads(self.text[self._key_start:])
                    except ValueError:
                        self.bad = True
                    self._top = "colon"
                elif outer:
                    self._end_member(pos + 1)
            elif ord(c) < 0x20:
                self.bad = True
            return
        if c in " \t\n\r":
            if self._scalar:
                self._end_member(pos)
            return
        if depth == 0:  # (only objects and arrays are read here)
            if c in "{[":
                self.stack.append(c)
                self._top = "key" if c == "{" else "value"
            else:
                self.bad = True
            return
        if outer and self._top == "key":
            if c == '"':
                self.in_str, self._key_start = True, pos
            elif c == "}" and not self.members:
                self._close(c)
            else:
                self.bad = True
            return
        if outer and self._top == "colon":
            if c == ":":
                self._top = "value"
            else:
                self.bad = True
            return
        if outer and self._scalar and c in ",}":
            self._end_member(pos)
        if outer and self._top == "comma":
            if c == ",":
                self._top = "key"
            elif c == "}":
                self._close(c)
            else:
                self.bad = True
            return
        if outer and self._top == "value" and self._key is not None and self._key not in self.members:
            self.members[self._key] = [pos, None]
            self._scalar = c not in '{["'
        if c in "{[":
            self.stack.append(c)
        elif c in "}]":
            self._close(c)
        elif c == '"':
            self.in_str = True
        elif c not in ",:" and c not in self._SCALAR:
            self.bad = True

    def _end_member(self, end: int) -> None:
        if self._key is not None and self._key in self.members and self.members[self._key][1] is None:
            self.members[self._key][1] = end
        self._scalar, self._key = False, None
        if self._top == "value":
            self._top = "comma"

    def _close(self, c: str) -> None:
        if not self.stack or {"}": "{", "]": "["}[c] != self.stack[-1]:
            self.bad = True
            return
        self.stack.pop()
        depth = len(self.stack)
        if depth == 1 and self.stack[0] == "{" and self._key is not None:
            self._end_member(len(self.text))  # (a container member ends with its bracket)
        if depth == 0:
            self.done = True

    def value(self, key: str) -> str | None:
        """The raw text of member `key` so far (whole once its end is known), None before it starts."""
        span = self.members.get(key)
        if span is None:
            return None
        start, end = span
        return self.text[start:end] if end is not None else self.text[start:]

    def whole(self, key: str) -> bool:
        span = self.members.get(key)
        return span is not None and span[1] is not None


class CallParser:
    """The calls in a model's answer, read as the text comes (module docstring). `feed(text)` and `finish()`
    return the `Piece`s found so far; text that could be the start of a call is held back until it is known."""

    def __init__(self, fmt: ToolFormat, schemas: dict[str, Any] | None = None):
        """`schemas`: function name -> its `parameters` (qwen3_xml reads its values by their types)."""
        self.fmt, self.schemas = fmt, schemas or {}
        self.xml_args: dict[str, Any] | None = None  # qwen3_xml: the arguments read so far
        self.buf = ""  # text not yet read
        self.state: Literal["start", "text", "text_only", "open", "body", "after", "name", "xml_function",
                            "xml_params"] = \
            "start" if fmt.open is None else "text"
        self.call: _Json | None = None
        self.raw = ""  # the current call's text as written (its markers included)
        self.name: str | None = None  # the current call's name, once announced
        self.sent = 0  # characters of its arguments given out
        self.array = False  # mistral: the calls are a JSON array
        self.blank = False  # just after a call: blanks are dropped

    def feed(self, text: str) -> list[Piece]:
        self.buf += text
        return self._run(final=False)

    def finish(self) -> list[Piece]:
        return self._run(final=True)

    def _run(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        while True:
            before = (self.state, len(self.buf))
            getattr(self, f"_{self.state}")(out, final)
            if (self.state, len(self.buf)) == before:
                break
        if final:
            if self.call is not None:
                self._end(out, ok=False)
            elif self.state in ("xml_function", "xml_params"):
                self._xml_end(out, None)
            if self.buf:
                out.append(Piece("text", self.buf))
                self.buf = ""
        return [p for p in out if p.kind != "text" or p.text]

    # -- states: each reads what it can of self.buf
    def _start(self, out: list[Piece], final: bool) -> None:
        """llama3_json: the answer is a call when it begins with <|python_tag|> or a JSON object."""
        s = self.buf.lstrip()
        if not s and not final:
            return
        if s.startswith("<|python_tag|>"):
            self.raw, self.buf = self.buf[:len(self.buf) - len(s)] + "<|python_tag|>", s[len("<|python_tag|>"):]
            self.state = "open"
        elif s.startswith("{") or (not final and "<|python_tag|>".startswith(s)):
            if s.startswith("{"):
                self.raw, self.buf, self.state = self.buf[:len(self.buf) - len(s)], s, "open"
        else:
            self.state = "text_only"

    def _blanks(self, final: bool) -> bool:
        """After a call, blanks are no text: dropped until other text comes. Whether to wait for more."""
        if self.blank:
            s = self.buf.lstrip()
            if not s:
                self.buf = "" if final else self.buf
                return True
            self.buf, self.blank = s, False
        return False

    def _text_only(self, out: list[Piece], final: bool) -> None:
        if self._blanks(final):
            return
        out.append(Piece("text", self.buf))
        self.buf = ""

    def _text(self, out: list[Piece], final: bool) -> None:
        opener = self.fmt.open
        assert opener is not None
        if self._blanks(final):
            return
        i = self.buf.find(opener)
        if i >= 0:  # (the blanks before a call are no text either: they go with the call's raw text)
            before = self.buf[:i].rstrip()
            out.append(Piece("text", before))
            self.raw, self.buf, self.state = self.buf[len(before):i] + opener, self.buf[i + len(opener):], "open"
            return
        keep = 0
        if not final:  # (held: what may begin the marker, and blanks that may come before it)
            keep = partial_suffix(self.buf, opener)
            keep = len(self.buf) - len(self.buf[:len(self.buf) - keep].rstrip())
        out.append(Piece("text", self.buf[:len(self.buf) - keep]))
        self.buf = self.buf[len(self.buf) - keep:]

    def _open(self, out: list[Piece], final: bool) -> None:
        """After the opening marker: blanks, then the call's JSON (mistral: a JSON array of them, or a name)."""
        s = self.buf.lstrip()
        if not s:
            self.raw, self.buf = self.raw + self.buf, ""
            return
        self.raw += self.buf[:len(self.buf) - len(s)]
        self.buf = s
        if self.fmt.name == "mistral" and not self.array and s[0] == "[":
            self.array, self.raw, self.buf = True, self.raw + "[", s[1:]
            return
        if self.fmt.name == "mistral_args":
            self.state = "name"
            return
        if self.fmt.name == "qwen3_xml":
            self.state = "xml_function"
            return
        if s[0] == "{":
            self.call, self.name, self.sent, self.state = _Json(), None, 0, "body"
            return
        self._fail(out)

    def _name(self, out: list[Piece], final: bool) -> None:
        """mistral_args: the function's name, then [ARGS] (or [CALL_ID]id[ARGS]) and its arguments' JSON."""
        m = re.match(r"([A-Za-z0-9_.-]+)(\[CALL_ID\][A-Za-z0-9]*)?\[ARGS\]", self.buf)
        if m is None:
            if final or not re.fullmatch(r"[A-Za-z0-9_.-]*(\[[A-Z_]*\]?[A-Za-z0-9]*\[?[A-Z]*\]?)?", self.buf):
                self._fail(out)
            return
        self.raw, self.buf = self.raw + m.group(0), self.buf[m.end():]
        self.name = m.group(1)
        self.call, self.sent, self.state = _Json(), 0, "body"
        out.append(Piece("start", name=self.name))

    def _xml_function(self, out: list[Piece], final: bool) -> None:
        """qwen3_xml: `<function=NAME>`, then its parameters."""
        m = re.match(r"<function=([A-Za-z0-9_.-]{1,64})>", self.buf)
        if m is None:
            if final or not re.fullmatch(r"<(f(u(n(c(t(i(o(n(=[A-Za-z0-9_.-]*)?)?)?)?)?)?)?)?)?", self.buf):
                self._fail(out)
            return
        self.raw, self.buf = self.raw + m.group(0), self.buf[m.end():]
        self.name, self.xml_args, self.state = m.group(1), {}, "xml_params"
        out.append(Piece("start", name=self.name))

    def _xml_params(self, out: list[Piece], final: bool) -> None:
        """qwen3_xml: each `<parameter=KEY>\\nVALUE\\n</parameter>` (an argument, given out whole), then
        `</function>`."""
        assert self.xml_args is not None
        s = self.buf.lstrip()
        blanks = self.buf[:len(self.buf) - len(s)]
        if s.startswith("</function>"):
            self.raw, self.buf = self.raw + blanks + "</function>", s[len("</function>"):]
            return self._xml_end(out, self.xml_args)
        m = re.match(r"<parameter=([^>\n]{1,128})>", s)
        end = s.find("</parameter>", m.end()) if m else -1
        if m is None or end < 0:
            partial = not s or "</function>".startswith(s) or "<parameter=".startswith(s) or \
                (m is not None or re.fullmatch(r"<parameter=[^>\n]*", s) is not None)
            if final or not partial:
                self._xml_end(out, None)
            return
        value = s[m.end():end]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        key = m.group(1)
        piece = ("{" if not self.xml_args else ", ") + json.dumps(key, ensure_ascii=False) + ": "
        self.xml_args[key] = _xml_value(value, self._param_schema(key))
        out.append(Piece("args", piece + json.dumps(self.xml_args[key], ensure_ascii=False)))
        self.raw, self.buf = self.raw + blanks + s[:end + len("</parameter>")], s[end + len("</parameter>"):]

    def _param_schema(self, key: str) -> dict[str, Any]:
        params = self.schemas.get(self.name or "") or {}
        prop = (params.get("properties") or {}).get(key) if isinstance(params, dict) else None
        return prop if isinstance(prop, dict) else {}

    def _xml_end(self, out: list[Piece], args: dict[str, Any] | None) -> None:
        """qwen3_xml: the call is over (`args` None: not a whole call)."""
        self.xml_args = None
        if args is None:
            if self.name is None:
                return self._fail(out)
            out.append(Piece("end", ok=False, raw=self.raw + self.buf))
            self.buf = ""
        else:
            if not args:
                out.append(Piece("args", "{"))
            out.append(Piece("args", "}"))
            out.append(Piece("end", ok=True, raw=self.raw, text=json.dumps(args, ensure_ascii=False)))
        self.name, self.raw = None, ""
        self.state, self.blank = ("after", True) if args is not None else ("text", False)

    def _body(self, out: list[Piece], final: bool) -> None:
        call = self.call
        assert call is not None
        used = call.push(self.buf)
        self.raw, self.buf = self.raw + self.buf[:used], self.buf[used:]
        if call.bad:
            return self._end(out, ok=False)
        self._announce(out)
        if call.done:
            self._end(out, ok=True)

    def _announce(self, out: list[Piece]) -> None:
        """The call's start once its name is whole (and, for llama3_json, it is known to be a call), then any new
        part of its arguments (an arguments string: whole, at the end)."""
        call = self.call
        assert call is not None
        if self.fmt.name == "mistral_args":
            args = call.text
        else:
            if self.name is None:
                if not call.whole("name") or not self._looks_like_call(call):
                    return
                try:
                    name = json.loads(call.value("name") or "")
                except ValueError:
                    return
                if not isinstance(name, str):
                    return
                self.name = name
                out.append(Piece("start", name=name))
            args = call.value(self._args_key(call) or "") or ""
            if args.startswith('"'):
                return
        if len(args) > self.sent:
            out.append(Piece("args", args[self.sent:]))
            self.sent = len(args)

    def _looks_like_call(self, call: _Json) -> bool:
        keys = set(call.members)
        if self.fmt.name == "llama3_json":  # (an answer that is some JSON object is text, unless a call's keys)
            return keys <= {"name", "parameters", "arguments"} and self._args_key(call) is not None
        return True

    def _args_key(self, call: _Json) -> str | None:
        for k in (self.fmt.args_key, "arguments", "parameters"):
            if k in call.members:
                return k
        return None

    def _end(self, out: list[Piece], ok: bool) -> None:
        """The call is over: checked whole; then what may follow it."""
        call = self.call
        assert call is not None
        self.call = None
        arguments = self._arguments(call) if ok and call.done else None
        if arguments is None:
            if self.name is None:  # (never announced: it is text)
                out.append(Piece("text", self.raw))
                self.raw, self.state = "", "text_only" if self.fmt.open is None else "text"
                if self.array:
                    self.array = False
                return
            out.append(Piece("end", ok=False, raw=self.raw))
            self.name, self.raw, self.array = None, "", False
            self.state = "text_only" if self.fmt.open is None else "text"  # (what follows, a closing marker too)
            return
        else:
            if self.name is None:  # (arguments before the name: announced now, whole)
                out.append(Piece("start", name=self._name_of(call)))
            elif self.fmt.name != "mistral_args" and (call.value(self._args_key(call) or "") or "").startswith('"'):
                out.append(Piece("args", arguments))
            out.append(Piece("end", ok=True, raw=self.raw, text=arguments))
        self.name, self.raw, self.state, self.blank = None, "", "after", True

    def _name_of(self, call: _Json) -> str:
        return str(json.loads(call.text)["name"])

    def _arguments(self, call: _Json) -> str | None:
        """The call's arguments as JSON text (the model's own), or None where it is not a valid call."""
        try:
            obj = json.loads(call.text)
        except ValueError:
            return None
        if self.fmt.name == "mistral_args":
            return call.text if isinstance(obj, dict) else None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not self._looks_like_call(call):
            return None
        key = self._args_key(call)
        raw = call.value(key) if key else None
        if raw is None:
            return None
        args = obj[key]
        if isinstance(args, str):  # (arguments sent as a JSON string: its text, if that is an object)
            try:
                return args if isinstance(json.loads(args), dict) else None
            except ValueError:
                return None
        return raw.strip() if isinstance(args, dict) else None

    def _after(self, out: list[Piece], final: bool) -> None:
        """After a call: blanks, then the closing marker, the next call (`;` / `,` / another opening marker)
        or text."""
        s = self.buf.lstrip()
        if not s and not final:
            return
        fmt = self.fmt
        if self.array:
            if s.startswith(","):
                self.buf, self.state = s[1:], "open"
            elif s.startswith("]"):
                self.buf, self.array, self.state = s[1:], False, "text"
            elif s or final:
                self.array, self.state = False, "text"
            return
        if fmt.close is not None:
            if s.startswith(fmt.close):
                self.buf, self.state = s[len(fmt.close):], "text"
            elif fmt.close.startswith(s):  # (the answer ended inside the closing marker: it is the call's)
                if final:
                    self.buf, self.state = "", "text"
                return
            else:
                self.state = "text"  # (no closing marker: the call ended with its JSON)
            return
        if fmt.name == "llama3_json":
            if s.startswith(";"):
                self.buf, self.state = s[1:], "open"
            else:
                self.buf, self.state = s, "text_only"
            return
        self.buf, self.state = s, "text"

    def _fail(self, out: list[Piece]) -> None:
        """What followed an opening marker is no call: text."""
        out.append(Piece("text", self.raw + self.buf))
        self.raw, self.buf, self.array = "", "", False
        self.state = "text_only" if self.fmt.open is None else "text"


def _xml_value(text: str, schema: dict[str, Any]) -> Any:
    """A qwen3_xml parameter's value by its schema's type: a string's text as it is, JSON for the others (and for
    a parameter the schema does not name, where the text is JSON); Python's True / False (what templates write
    back) as booleans."""
    if is_text(schema):
        return text
    if schema.get("type") == "boolean" and text.strip() in ("True", "False"):
        return text.strip() == "True"
    try:
        return json.loads(text)
    except ValueError:
        return text


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Parsed:
    """A whole answer: its text (calls that are not valid stay in it, where they stood) and its calls."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)


def parse(fmt: ToolFormat, text: str, parallel: bool = True, schemas: dict[str, Any] | None = None) -> Parsed:
    """The calls in a whole answer (`parallel` False: the first alone; `schemas`: as CallParser's)."""
    p = CallParser(fmt, schemas)
    pieces = [*p.feed(text), *p.finish()]
    content: list[str] = []
    calls: list[ToolCall] = []
    name = ""
    for piece in pieces:
        if piece.kind == "text":
            content.append(piece.text)
        elif piece.kind == "start":
            name = piece.name
        elif piece.kind == "end":
            if piece.ok and FUNCTION_NAME.match(name):
                calls.append(ToolCall(new_call_id(fmt), name, piece.text))
            else:
                content.append(piece.raw)
    return Parsed("".join(content), calls if parallel else calls[:1])
