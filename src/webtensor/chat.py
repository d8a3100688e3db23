"""Chat templates: a conversation rendered as the model's own jinja2 template renders it, exactly as
transformers' `apply_chat_template(..., tokenize=False)` renders it, or, for a model without one (GPT-2),
webtensor's plain template:

    System: You are terse.
    User: Hello!
    Assistant: Hi.
    User: How are you?
    Assistant:

("developer" messages read as "System"; a message's content may be OpenAI's list of text parts, rendered as their
text joined).

One place decides what ends the assistant's turn, for every front end (the chat CLI, the server's chat and
responses, the page): `turn_stops(model)` -- with the plain template the start of the next turn ("\nUser:",
"\nSystem:": stop strings, cut off so that an invented turn never becomes part of the reply); with the model's
own template the special token it writes after an assistant's message (ChatML's <|im_end|>, Llama 3's
<|eot_id|>) where that is not one of the model's EOS ids already. `check_template(model)` renders small test
conversations when a model is loaded, so that a template that cannot serve a chat is said so at once, not at
the first message.

`ChatTemplate(source, bos_token=..., eos_token=..., **extra)` compiles a template in the environment
transformers uses (transformers/utils/chat_template_utils.py): jinja2's ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loop-controls extension and the `{% generation %}` tag, a `tojson` that
keeps non-ASCII text and takes `indent`, the globals `raise_exception`, `strftime_now`, `dict` and a
`namespace` that refuses underscore names. `render(messages, add_generation_prompt=True, **kwargs)` passes
the messages as plain dicts (None-valued keys dropped, a message's reasoning under both `reasoning_content`
and `thinking`, as transformers does), `tools` / `documents` and any other keyword (Qwen3's
`enable_thinking`, Llama 3's `date_string`) through to the template. A template that cannot render a
conversation -- its own `raise_exception`, a syntax error, a failure while rendering -- raises one
`ChatTemplateError` line.

`find_chat_template` says where a checkpoint keeps its template: a directory's `chat_template.jinja` (what
newer transformers writes) or `tokenizer_config.json`'s `chat_template` (a string, or a list of named
templates), a GGUF file's `tokenizer.chat_template` (and `tokenizer.chat_template.<name>`).

jinja2 and markupsafe are pure Python (markupsafe's C speedups are optional), so this module runs in the
page's Pyodide too, with both shipped in its zip."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, is_dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ChatTemplateError, CheckpointError

if TYPE_CHECKING:  # (jinja2 is imported where a template is compiled)
    import jinja2

PLAIN_TEMPLATE = (
    "{% set names = {'system': 'System', 'developer': 'System', 'user': 'User', 'assistant': 'Assistant'} %}"
    "{% for m in messages %}"
    "{% if m['role'] not in names %}"
    "{{ raise_exception('the plain chat template renders system, developer, user and assistant messages, not ' "
    "~ m['role']) }}"
    "{% endif %}"
    "{{ names[m['role']] }}: "
    "{% if m['content'] is string or m['content'] is not defined %}{{ m['content'] }}"
    "{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% else %}{{ raise_exception('the plain chat template renders text parts only, not ' ~ part['type']) }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '\\n' }}"  # (an expression: trim_blocks would eat a newline written after a block tag)
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}")
PLAIN_STOPS = ["\nUser:", "\nSystem:"]

# The conversation `turn_stops` and `check_template` render: a question, an answer, a thank-you.
PROBE = [{"role": "user", "content": "Hello, who are you?"},
         {"role": "assistant", "content": "I am a helpful assistant."},
         {"role": "user", "content": "Thank you."}]

# The names a message's reasoning comes under; templates read the first (transformers fills both it and
# "thinking" from whichever is set).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def template_for(model: Any) -> ChatTemplate:
    """The ChatTemplate a model renders conversations with (its own, or the plain one), with its
    tokenizer's named special tokens (bos_token, eos_token, ...) as template variables."""
    tok = model.tokenizer
    tokens = dict(getattr(tok, "special_tokens_map", None) or {})
    return ChatTemplate(model.chat_template or PLAIN_TEMPLATE, **tokens)


@dataclass(frozen=True)
class TurnStops:
    """What ends the assistant's turn besides the model's EOS ids: `strings` (text that starts another turn: cut off,
    never part of the message) and `token_ids` (the template's end-of-turn token, where it is not an EOS id)."""

    strings: tuple[str, ...] = ()
    token_ids: tuple[int, ...] = ()


def turn_stops(model: Any) -> TurnStops:
    """Where an assistant's reply ends, for `model` (anything with `chat_template`, `tokenizer` and `eos_ids`: a
    LanguageModel, a serving engine, a Checkpoint). The plain template (no template of its own): the next turn's
    start, `PLAIN_STOPS`. Its own template: the special token the template writes right after an assistant's
    message (found by rendering `PROBE`), unless that is an EOS id already; nothing where the template writes no
    special token there or cannot render `PROBE` (`check_template` says why)."""
    if not model.chat_template:
        return TurnStops(tuple(PLAIN_STOPS))
    end = _turn_end_token(model)
    if end is None or end in frozenset(getattr(model, "eos_ids", ()) or ()):
        return TurnStops()
    return TurnStops((), (end,))


def stops_for(model: Any) -> list[str]:
    """The stop strings of `turn_stops(model)` (a front end must also stop at its `token_ids`)."""
    return list(turn_stops(model).strings)


def _turn_end_token(model: Any) -> int | None:
    """The special token that follows an assistant's message in the template's rendering of PROBE, or None."""
    try:
        text = template_for(model).render(PROBE, add_generation_prompt=True)
    except ChatTemplateError:
        return None
    answer = PROBE[1]["content"]
    at = text.find(answer)
    rest = text[at + len(answer):].lstrip() if at >= 0 else ""
    if not rest:
        return None
    tok = model.tokenizer
    if tok is None:
        return None
    ids = tok.encode(rest, add_special_tokens=False)
    return ids[0] if ids and ids[0] in getattr(tok, "special_ids", ()) else None


def check_template(model: Any, system: str | None = None) -> None:
    """ChatTemplateError unless `model`'s chat template (its own, or the plain one) compiles and renders small
    conversations sensibly: one user message, and a question, an answer and a second question (PROBE); with
    `system`, those after that system message. Sensibly: without an error, and with the text of every message in
    what it renders. The error names what failed and on which conversation."""
    template = template_for(model)  # (a syntax error raises here)
    head = [{"role": "system", "content": system}] if system is not None else []
    for what, conversation in (("one user message", PROBE[:1]), ("a question, an answer and a question", PROBE)):
        messages = [*head, *conversation]
        what = f"a system message and {what}" if head else what
        try:
            text = template.render(messages, add_generation_prompt=True)
        except ChatTemplateError as e:
            raise ChatTemplateError(f"{e} (checked with {what})") from None
        missing = [m["content"] for m in messages if m["content"].strip() not in text]
        if missing:
            raise ChatTemplateError(f"the chat template leaves out a message's text ({missing[0]!r:.40}) when it "
                                    f"renders {what}")


class ChatTemplate:
    """A jinja2 chat template, rendered in a sandbox as transformers renders it."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", **extra: Any):
        """Compile `source`. `bos_token`, `eos_token` and `extra` (unk_token, pad_token, ...) are
        variables every rendering sees, as transformers passes a tokenizer's special tokens; a
        keyword given to `render` overrides them."""
        if not isinstance(source, str):
            raise ChatTemplateError(f"a chat template must be a str, got {type(source).__name__}")
        self.source = source
        self.variables: dict[str, Any] = {"bos_token": bos_token, "eos_token": eos_token, **extra}
        self._template = _compile(source)

    def render(self, messages: Iterable[Any], add_generation_prompt: bool = True, *,
               tools: list[dict[str, Any]] | None = None, documents: list[dict[str, Any]] | None = None,
               **kwargs: Any) -> str:
        """The conversation as text. `messages`: dicts with "role" and "content" (or dataclasses);
        `add_generation_prompt`: end with the header of the assistant's next turn."""
        msgs = _messages(messages)
        for name, items in (("tools", tools), ("documents", documents)):
            if items is not None and not (isinstance(items, list) and all(isinstance(x, dict) for x in items)):
                raise ChatTemplateError(f"{name} must be a list of dicts (JSON schemas / documents), got {items!r:.80}")
        context = {**self.variables, **_plain(kwargs)}
        try:
            return self._template.render(messages=msgs, tools=_plain(tools), documents=_plain(documents),
                                         add_generation_prompt=add_generation_prompt, **context)
        except ChatTemplateError:
            raise
        except Exception as e:  # noqa: BLE001 - the template is untrusted code: any failure is the template's
            raise ChatTemplateError(f"the chat template failed to render this conversation: "
                                    f"{type(e).__name__}: {_one_line(str(e))}") from e


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _plain(value: Any) -> Any:
    """`value` as plain JSON-like data (what the sandboxed template may see): dataclasses and objects with
    `model_dump` (pydantic, the OpenAI SDK's messages) become dicts."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    if isinstance(value, str):  # subclasses (enums, numpy scalars): their base value
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    return f"<{type(value).__name__}>"


def _messages(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """Plain message dicts as transformers hands them to a template: keys whose value is None dropped,
    reasoning under both `reasoning_content` and `thinking`."""
    if isinstance(messages, (str, bytes, Mapping)):
        raise ChatTemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(_plain(list(messages))):
        if not isinstance(m, dict):
            raise ChatTemplateError(f"message {i} must be a dict with 'role' and 'content', got {m!r:.60}")
        m = {k: v for k, v in m.items() if v is not None}
        if not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"message {i} has no 'role' string: {m!r:.60}")
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    if not out:
        raise ChatTemplateError("cannot render an empty conversation: give at least one message")
    return out


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    """The compiled template, in transformers' environment (see the module docstring)."""
    try:
        import jinja2
        import jinja2.ext
        import jinja2.nodes
        import jinja2.sandbox
        import jinja2.utils
    except ImportError as e:
        raise ChatTemplateError(f"chat templates need jinja2, which is not installed ({e})") from e

    class GenerationTag(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (marks the assistant's text for training masks):
        renders its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    def raise_exception(message: Any) -> None:
        raise ChatTemplateError(f"the chat template refused this conversation: {_one_line(str(message))}")

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class TemplateDict:
        """`dict(...)` for templates, without the class itself (no attribute access to break out through)."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """jinja2's namespace, refusing underscore-prefixed attribute names (CPython internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # (self in args: jinja2's own signature trick)
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a template may not set the attribute {name!r}")

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=TemplateDict(),
                       namespace=TemplateNamespace)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template syntax error on line {e.lineno}: {_one_line(e.message or '')}") from e


def find_chat_template(source: str | Path | Mapping[str, Any], name: str | None = None) -> str | None:
    """The chat template a checkpoint keeps, or None where it has none.

    `source`: a checkpoint directory -- its `chat_template.jinja` (newer transformers; named ones in
    `additional_chat_templates/<name>.jinja`) takes priority over `tokenizer_config.json`'s `chat_template`
    (a string, or a list of {"name", "template"}) -- or a GGUF file's metadata (`tokenizer.chat_template`,
    `tokenizer.chat_template.<name>`). `name`: which of several named templates (None: the default one).
    A malformed field raises a CheckpointError naming it; a name the checkpoint lacks, a ChatTemplateError
    listing the names it has."""
    templates = _gguf_templates(source) if isinstance(source, Mapping) else _dir_templates(Path(source))
    if not templates:
        return None
    key = name or "default"
    if key not in templates:
        if name is None:
            raise ChatTemplateError(f"{source}: several chat templates ({', '.join(sorted(templates))}) and no "
                                    "default: name one")
        raise ChatTemplateError(f"{source}: no chat template named {name!r} (it has {', '.join(sorted(templates))})")
    return templates[key]


def _dir_templates(d: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    config = d / "tokenizer_config.json"
    if config.is_file():
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{config} cannot be read: {_one_line(str(e))}") from e
        t = data.get("chat_template") if isinstance(data, dict) else None
        if isinstance(t, str):
            out["default"] = t
        elif isinstance(t, list):
            for i, item in enumerate(t):
                if not (isinstance(item, dict) and isinstance(item.get("name"), str)
                        and isinstance(item.get("template"), str)):
                    raise CheckpointError(f"{config}: chat_template[{i}] must be {{'name': str, 'template': str}}")
                out[item["name"]] = item["template"]
        elif t is not None:
            raise CheckpointError(f"{config}: chat_template must be a string or a list of named templates, "
                                  f"got {type(t).__name__}")
    files = {"default": d / "chat_template.jinja"}
    extra = d / "additional_chat_templates"
    if extra.is_dir():
        files.update({f.stem: f for f in sorted(extra.glob("*.jinja"))})
    for key, f in files.items():
        if f.is_file():
            try:
                out[key] = f.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise CheckpointError(f"{f} cannot be read: {_one_line(str(e))}") from e
    return out


def _gguf_templates(meta: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    prefix = "tokenizer.chat_template"
    for key, value in meta.items():
        if key == prefix or key.startswith(prefix + "."):
            if not isinstance(value, str):
                raise CheckpointError(f"GGUF metadata {key} must be a string, got {type(value).__name__}")
            out["default" if key == prefix else key[len(prefix) + 1:]] = value
    return out
