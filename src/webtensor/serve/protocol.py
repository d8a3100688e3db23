"""OpenAI's request and response shapes for /v1/completions, /v1/chat/completions, /v1/responses
(text in and text out: ResponsesRequest says what is accepted, ignored and refused) and /v1/models
(as its published OpenAPI document has them), vLLM's for /tokenize and /detokenize, and OpenAI's
error body.

Requests are validated strictly: an unknown field, a wrong type, a value out of range, NaN or
Infinity, or text that is not valid Unicode (a lone surrogate such as "\\ud800") is refused with
HTTP 400 naming the field. Whatever passes is something the sampler accepts, so no request can fail
inside an engine step for its parameters. Values the OpenAI spec allows are accepted: null for any
optional field, `prompt: null` (the model starts a new document), a list of prompts (one choice
each), `max_tokens: 0` (nothing generated), `top_p: 0` (the most likely token: greedy),
`response_format: {"type": "text"}`; fields that only concern OpenAI's own service are accepted and
ignored (`store`, `metadata`, `service_tier`, `user`, `safety_identifier`, `prompt_cache_key`,
`parallel_tool_calls`, `stream_options.include_obfuscation`). Sampling: `n` choices (1 to 128), `seed`,
`presence_penalty` / `frequency_penalty`, `logit_bias` (token id -> -100..100), log-probabilities
(completions: `logprobs` 0..20 and `echo`; chat: `logprobs` + `top_logprobs` 0..20), structured output
(`response_format` json_object / json_schema). Options not implemented are refused by name
(`best_of` > 1, `suffix`, tools). Extensions, as vLLM has them: `top_k` (0 or -1: off), `min_p`,
`repetition_penalty`, `min_tokens`, `stop_token_ids` and `ignore_eos`. The flags vLLM's router adds to each request
it forwards (FIXED_EXTENSIONS) are accepted at the values that ask for what webtensor does, the others refused.

Responses: chat messages carry `refusal: null`; a streamed chat's first chunk alone has
`delta.role`; every chunk of a stream has the stream's one `created`; `usage` appears on streamed
chunks only when `stream_options.include_usage` asks for it: in a last chunk of its own, and in
chat as null on each chunk before it, as OpenAI sends it (the spec's completion chunk has no null
usage: there it is left out).
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from ..errors import WebtensorError

MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_PROMPTS = 128  # prompts in one completions request (OpenAI's limit on n, for want of one on batches)
MAX_N = 128  # choices per prompt (OpenAI's limit on n)
MAX_LOGPROBS = 20  # top log-probabilities per token (OpenAI's chat limit; vLLM's default max_logprobs)
NEG_INF_LOGPROB = -9999.0  # a -inf log-probability as JSON carries it (vLLM's value: JSON has no -Infinity)
SEED_MAX = 2**64 - 1  # the sampler's seeds are 64-bit (larger ones would fold in; the spec's int64 fits)


class APIError(WebtensorError):
    """An error the HTTP client gets back as OpenAI's body {"error": {message, type, param, code}}."""

    TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
             429: "rate_limit_error", 503: "service_unavailable"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message = status, _printable(message)
        self.param, self.code = (None if param is None else _printable(param)), code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        """OpenAI's error type: by status, else any 4xx is the client's (invalid_request_error)."""
        return self.TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _printable(s: str) -> str:
    """`s` as text that encodes to UTF-8: a lone surrogate (from a field name or value the client
    sent) as its escape, \\ud800."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def validation_error(errors: list[dict[str, Any]]) -> APIError:
    """An APIError (400) from pydantic / FastAPI validation errors, naming the field: of the errors
    (a union gives one per member), one of this module's own checks if any failed, else the one
    that got deepest into the value (for ["a", 5]: prompt.1, not "prompt is not a string")."""
    def loc_of(e: dict[str, Any]) -> list[str]:
        return [str(p) for p in e.get("loc", ()) if p != "body" and not _type_tag(str(p))]

    e = max(errors, key=lambda e: (e.get("type") == "value_error", len(loc_of(e))), default=None) \
        or {"loc": (), "msg": "invalid request", "type": "invalid"}
    loc = loc_of(e)
    if e.get("type") == "json_invalid":
        return APIError(400, f"malformed JSON in the request body: {e.get('ctx', {}).get('error', e['msg'])}",
                        code="invalid_json")
    if e.get("type") == "model_attributes_type" and not loc:
        return APIError(400, "the request body must be a JSON object (and sent as Content-Type: application/json)",
                        code="invalid_body")
    msg = str(e.get("msg", "invalid value"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    named = re.match(r"([A-Za-z_][\w.]*): ", msg)  # (a check of several fields names the one at fault first)
    if named:
        loc, msg = [*loc, *named.group(1).split(".")], msg[named.end():]
    param = ".".join(loc) or None
    return APIError(400, f"{param}: {msg}" if param else msg, param=param, code=str(e.get("type", "invalid")))


def _type_tag(part: str) -> bool:
    """pydantic names the union member that failed in an error's location ("str", "list[int]",
    "function-after[...]", a model's name or tag: "InputMessage"): skip it."""
    return part in ("str", "int", "float", "bool", "list", "dict", "none") or "[" in part or "-" in part or \
        (part[:1].isupper() and part.isidentifier())


# -- field types --------------------------------------------------------------------------------------
def _unicode(s: str) -> str:
    """Text must be valid Unicode: JSON's "\\ud800" escapes make lone surrogates, which no tokenizer
    (and no UTF-8 encoder) takes."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"the text holds a lone surrogate (U+{ord(s[e.start]):04X} at character {e.start}), "
                         "which is not valid Unicode") from None
    return s


def _finite(v: Any) -> Any:
    """NaN and ±Infinity (which Python's JSON reader takes) refused by name, before the range check."""
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{'NaN' if math.isnan(v) else 'Infinity' if v > 0 else '-Infinity'} is not a "
                         "finite number")
    return v


Text = Annotated[StrictStr, AfterValidator(_unicode)]
Temperature = Annotated[float, BeforeValidator(_finite), Field(ge=0.0, le=2.0, strict=True)]
TopP = Annotated[float, BeforeValidator(_finite), Field(ge=0.0, le=1.0, strict=True)]
Penalty = Annotated[float, BeforeValidator(_finite), Field(ge=-2.0, le=2.0, strict=True)]
RepetitionPenalty = Annotated[float, BeforeValidator(_finite), Field(gt=0.0, le=100.0, strict=True)]
MinP = Annotated[float, BeforeValidator(_finite), Field(ge=0.0, le=1.0, strict=True)]
Bias = Annotated[float, BeforeValidator(_finite), Field(ge=-100.0, le=100.0, strict=True)]
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_LOGPROBS, strict=True)]
N = Annotated[int, Field(ge=1, le=MAX_N, strict=True)]
TokenId = Annotated[int, Field(ge=0, strict=True)]
TopK = Annotated[int, Field(ge=-1, strict=True)]
Seed = Annotated[int, Field(ge=0, le=SEED_MAX, strict=True)]
MaxTokens = Annotated[int, Field(ge=0, strict=True)]
Stop = Text | list[Text] | None

# Other servers' boolean extensions, accepted at the value that asks for what webtensor does (the other value is
# refused, saying why). vLLM's router (`vllm-router`: docs/replicas.md) sends them on every request it forwards, at
# these values: SGLang's `no_stop_trim`, `return_hidden_states`, `separate_reasoning`, `stream_reasoning`, vLLM's
# `skip_special_tokens`, `continue_final_message`, `include_reasoning`.
FIXED_EXTENSIONS: dict[str, tuple[bool, str]] = {
    "skip_special_tokens": (True, "special tokens are never part of the text"),
    "no_stop_trim": (False, "a stop string is always cut from the text"),
    "return_hidden_states": (False, "hidden states are not returned"),
    "continue_final_message": (False, "the reply is a new assistant turn"),
    "include_reasoning": (True, "the reply's text is given whole"),
    "separate_reasoning": (True, "the reply's text is given whole"),
    "stream_reasoning": (True, "the reply's text is streamed whole"),
}


def _fixed_extension(v: bool, info: ValidationInfo) -> bool:
    want, why = FIXED_EXTENSIONS[str(info.field_name)]
    if v is not want:
        raise ValueError(f"only {str(want).lower()} is supported: {why}")
    return v


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool | None = None
    include_obfuscation: StrictBool | None = None  # accepted; no obfuscation field is ever added


class SamplingRequest(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="forbid")

    model: Text
    temperature: Temperature | None = None  # None: 1.0, as OpenAI
    top_p: TopP | None = None  # 0: only the most likely token (greedy)
    top_k: TopK | None = None  # extension; 0 or -1: off (as vLLM)
    seed: Seed | None = None
    stop: Stop = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    n: N | None = None  # choices per prompt (each its own sequence; see app.choice seeds)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[Text, Bias] | None = None  # token id (as a string) -> bias added to its logit
    user: Text | None = None  # ignored
    ignore_eos: StrictBool = False  # extension: generate max_tokens even past the end-of-text token
    # extensions, as vLLM has them
    repetition_penalty: RepetitionPenalty | None = None  # HF's, over prompt and generated tokens (1: off)
    min_p: MinP | None = None
    min_tokens: Annotated[int, Field(ge=0, strict=True)] | None = None  # no EOS / stop ids before this many
    stop_token_ids: list[TokenId] | None = None  # ids that end the sequence (as EOS does)
    # other servers' extensions (FIXED_EXTENSIONS)
    skip_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    return_hidden_states: StrictBool = False
    _fixed = field_validator("skip_special_tokens", "no_stop_trim", "return_hidden_states")(_fixed_extension)

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Stop) -> Stop:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences, got {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("a stop sequence must not be empty")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for k in v or {}:
            if not (k.isascii() and k.isdigit()) or len(k) > 12:
                raise ValueError(f"keys must be token ids (decimal integers), got {k!r}")
        return v

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if v is not None and not info.data.get("stream"):
            raise ValueError("only allowed when stream is true")
        return v

    def choices(self) -> int:
        return self.n or 1

    def bias(self) -> dict[int, float]:
        return {int(k): v for k, v in (self.logit_bias or {}).items()}

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling_values(self) -> tuple[float, int | None, float | None]:
        """(temperature, top_k, top_p) as the sampler takes them: temperature 1 by default, top_k
        0 / -1 as None (off), top_p 0 as greedy (the nucleus of mass 0 is the one most likely token,
        the token argmax picks: the first of the largest)."""
        temperature = 1.0 if self.temperature is None else self.temperature
        top_k = self.top_k if self.top_k is not None and self.top_k > 0 else None
        top_p = self.top_p
        if top_p == 0:
            temperature, top_p = 0.0, None
        return temperature, top_k, top_p


IdList = list[StrictInt]
Prompt = Text | IdList | list[Text] | list[IdList]


class CompletionRequest(SamplingRequest):
    prompt: Prompt | None  # required; null: an empty prompt (the model starts a new document)
    max_tokens: MaxTokens | None = None  # None: 16 (fewer where the context ends first)
    echo: StrictBool | None = None  # the prompt's text (and, with logprobs, its tokens' log-probabilities) first
    logprobs: TopLogprobs | None = None  # each token's log-probability and the k most likely (0: none of those)
    best_of: StrictInt | None = None
    suffix: Text | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Prompt | None) -> Prompt | None:
        if isinstance(v, list) and v and isinstance(v[0], str | list) and len(v) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts in one request, got {len(v)}")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError("only best_of=1 is supported")
        return v

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported")
        return v

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one choice each: text or token ids (null: one empty prompt)."""
        p = self.prompt
        if p is None:
            return [""]
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            return list(p)
        return [p]  # type: ignore[list-item]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: Text


class FunctionCallIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Text
    arguments: Text  # (JSON text, as the answer gave it)


class ToolCallIn(BaseModel):
    """An assistant's earlier tool call, sent back in the history."""

    model_config = ConfigDict(extra="forbid")
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = Field(default=None, validate_default=True)  # null: an assistant only
    name: Text | None = None
    refusal: Text | None = None  # (an assistant's turn sent back as it came)
    tool_calls: list[ToolCallIn] | None = None  # an assistant's calls
    tool_call_id: Text | None = None  # a tool message: the call it answers
    reasoning_content: Text | None = None  # an assistant's reasoning sent back (vLLM's field; its template may
    reasoning: Text | None = None  # show it)

    @field_validator("content")
    @classmethod
    def _content(cls, v: str | list[TextPart] | None, info: ValidationInfo) -> str | list[TextPart] | None:
        # OpenAI's schema: content is text or a list of at least one part; only an assistant's may be null
        role = info.data.get("role")
        if v is None and role != "assistant":
            raise ValueError(f"a {role} message needs content: text or a list of at least one part")
        if isinstance(v, list) and not v:
            raise ValueError(f"a {role} message's content must be text or a list of at least one part, got an "
                             "empty list")
        return v

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls: only an assistant message has them, not a {self.role} message")
        if (self.tool_call_id is not None) != (self.role == "tool"):
            raise ValueError("tool_call_id: a tool message needs one (the id of the call it answers), and only it")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates read it (transformers' form): text content, and the calls' arguments as
        objects where they are JSON objects (templates write them with `tojson`)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}  # (null as "": templates read text)
        for key in ("name", "tool_call_id", "reasoning_content", "reasoning"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _json_object(c.function.arguments)}}
                for c in self.tool_calls]
        return out


def _json_object(text: str) -> Any:
    """`text` as the object it encodes, where it encodes one (else the text itself)."""
    try:
        v = json.loads(text)
    except ValueError:
        return text
    return v if isinstance(v, dict) else text


FunctionName = Annotated[str, Field(strict=True, pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: FunctionName
    description: Text | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments (an object); None: no arguments
    strict: StrictBool | None = None  # (calls that are forced always follow the schema)

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type", "object") != "object":
            raise ValueError(f"must be a JSON schema of type object (the arguments), got type {v.get('type')!r}")
        return v


class ChatTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: FunctionName


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def check_tools(tools: list[dict[str, Any]] | None, choice: str | None, param: str = "tool_choice") -> None:
    """A request's tools and tool_choice agree: names unique, "required" or a named function only with tools,
    and that function among them (`choice`: the name, or "none" / "auto" / "required")."""
    names = [t["name"] for t in tools or []]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ValueError(f"tools: two tools are named {dup!r}")
    if choice not in (None, "none", "auto") and not names:
        raise ValueError(f"{param}: {choice!r} needs tools")
    if choice not in (None, "none", "auto", "required") and choice not in names:
        raise ValueError(f"{param}: there is no tool named {choice!r} (tools: {', '.join(names)})")


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(strict=True, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # None: any JSON object
    strict: StrictBool | None = None  # (the schema is always enforced: constrained decoding)


class ResponseFormat(BaseModel):
    """OpenAI's response_format: text; json_object (some JSON object); json_schema (JSON valid by a schema)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is given with type json_schema, and only then")
        return self


class ChatRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: MaxTokens | None = None  # None: up to the context's end
    max_completion_tokens: MaxTokens | None = None
    logprobs: StrictBool | None = None  # each generated token's log-probability
    top_logprobs: TopLogprobs | None = None  # and the k most likely there (needs logprobs true)
    response_format: ResponseFormat | None = None
    tools: Annotated[list[ChatTool], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None  # None: "auto" with tools, "none" without
    parallel_tool_calls: StrictBool | None = None  # None: true (several calls in one answer)
    chat_template_kwargs: dict[Text, Any] | None = None  # (vLLM's) more variables for the chat template
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None  # (to the template)
    modalities: list[Literal["text"]] | None = None
    # only OpenAI's service uses these: accepted and ignored
    store: StrictBool | None = None
    metadata: dict[Text, Text] | None = None
    service_tier: Text | None = None
    safety_identifier: Text | None = None
    prompt_cache_key: Text | None = None
    # other servers' extensions (FIXED_EXTENSIONS)
    continue_final_message: StrictBool = False
    include_reasoning: StrictBool = True
    separate_reasoning: StrictBool = True
    stream_reasoning: StrictBool = True
    _fixed_chat = field_validator("continue_final_message", "include_reasoning", "separate_reasoning",
                                  "stream_reasoning")(_fixed_extension)

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return v

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted(set(v or {}) & {"messages", "tools", "documents", "add_generation_prompt"})
        if taken:
            raise ValueError(f"{taken[0]} is the request's own (give it as a field of the request)")
        return v

    @model_validator(mode="after")
    def _tool_choice(self) -> ChatRequest:
        check_tools([t.function.model_dump() for t in self.tools or []], self.choice())
        if self.choice() not in ("none", "auto") and self.response_format and self.response_format.type != "text":
            raise ValueError("response_format: a json format cannot go with a tool_choice that forces a call")
        return self

    def choice(self) -> str:
        """tool_choice as "none", "auto", "required" or the named function's name."""
        c = self.tool_choice
        if c is None:
            return "auto" if self.tools else "none"
        return c if isinstance(c, str) else c.function.name

    def function_tools(self) -> list[dict[str, Any]]:
        """The tools as OpenAI's function definitions (name, description, parameters, strict)."""
        return [t.function.model_dump(exclude_none=True) for t in self.tools or []]

    def template_kwargs(self) -> dict[str, Any]:
        kw = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            kw.setdefault("reasoning_effort", self.reasoning_effort)
        return kw

    def max_new(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: `prompt` (text), or `messages` (the chat template's prompt)."""

    model_config = ConfigDict(extra="forbid")
    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True  # the tokenizer's own (a BOS for Llama 3; GPT-2 adds none)
    add_generation_prompt: StrictBool = True  # end the rendered chat with the assistant's turn
    return_token_strs: StrictBool = False
    tools: Annotated[list[ChatTool], Field(max_length=128)] | None = None  # (with messages: as chat renders them)
    chat_template_kwargs: dict[Text, Any] | None = None

    _template_kwargs = field_validator("chat_template_kwargs")(
        ChatRequest._template_kwargs.__func__)  # type: ignore[attr-defined]

    @model_validator(mode="after")
    def _one(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt (text) or messages (a chat)")
        if self.messages is None and (self.tools is not None or self.chat_template_kwargs is not None):
            raise ValueError("tools and chat_template_kwargs go with messages")
        return self


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Text | None = None
    tokens: IdList


# -- responses ----------------------------------------------------------------------------------------
FinishReason = Literal["stop", "length", "tool_calls"]


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens found in the slot's prefix cache (not computed again)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None  # (left out of the JSON where None)

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("prompt_tokens_details") is None:
            out.pop("prompt_tokens_details", None)
        return out

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int | None = None) -> Usage:
        details = None if cached is None else PromptTokensDetails(cached_tokens=cached)
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                   prompt_tokens_details=details)


class CompletionLogprobs(BaseModel):
    """The completions API's log-probabilities: per token its text, log-probability (None for a prompt's first
    token), the k most likely {text: log-probability} and its offset in the choice's text."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ChatMessageOut(BaseModel):
    """The answer: its text (None where it is only calls), its tool calls and (vLLM's field) its reasoning; the
    last two are left out of the JSON where there are none."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCallOut] | None = None
    reasoning_content: str | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None
    refusal: list[ChatTokenLogprob] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "webtensor"
    max_model_len: int  # (vLLM's extension: the context, in tokens)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


# -- the Responses API (/v1/responses) -----------------------------------------------------------------
class InputText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["input_text"]
    text: Text


class OutputTextIn(BaseModel):
    """An assistant's earlier output sent back in `input` (as the response gave it)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["output_text"]
    text: Text
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class InputMessage(BaseModel):
    """One message of `input`: OpenAI's EasyInputMessage ({role, content}) or an input / output message item
    ({"type": "message", ...}; an output message sent back carries its id and status)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[Annotated[InputText | OutputTextIn, Field(discriminator="type")]]
    id: Text | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, v: str | list[InputText | OutputTextIn], info: ValidationInfo) -> Any:
        role = info.data.get("role")
        if isinstance(v, list) and role != "assistant" and any(p.type == "output_text" for p in v):
            raise ValueError(f"output_text parts are an assistant's; a {role} message has input_text parts")
        return v

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ResponseTextFormat(BaseModel):
    """`text.format`: text; json_object; json_schema (name and schema beside the type, not nested as chat's)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(strict=True, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")] | None = None
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None

    @model_validator(mode="after")
    def _fields(self) -> ResponseTextFormat:
        schema_fields = {"name", "description", "schema_", "strict"} & self.model_fields_set
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise ValueError("type json_schema needs name and schema")
        if self.type != "json_schema" and schema_fields:
            raise ValueError(f"name, description, schema and strict go with type json_schema, not {self.type}")
        return self

    def response_format(self) -> ResponseFormat:
        """The same format as chat's response_format (one structured-output path)."""
        js = None
        if self.type == "json_schema":
            js = JSONSchemaFormat.model_validate({"name": self.name, "description": self.description,
                                                  "schema": self.schema_, "strict": self.strict})
        return ResponseFormat(type=self.type, json_schema=js)


class ResponseText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: ResponseTextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint to OpenAI's models; accepted and echoed


class ResponseStreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_obfuscation: StrictBool | None = None  # accepted; no obfuscation field is ever added


class FunctionTool(BaseModel):
    """A function tool of the Responses API (flat: name and parameters beside the type)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    name: FunctionName
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None

    _parameters = field_validator("parameters")(FunctionDef._parameters.__func__)  # type: ignore[attr-defined]


class FunctionToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    name: FunctionName


class FunctionCallItem(BaseModel):
    """An earlier function_call output item sent back in `input`."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function_call"]
    call_id: Text
    name: Text
    arguments: Text
    id: Text | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(BaseModel):
    """A tool's answer to a call (`call_id`), in `input`."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function_call_output"]
    call_id: Text
    output: Text | list[InputText]
    id: Text | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["reasoning_text", "summary_text"]
    text: Text


class ReasoningItemIn(BaseModel):
    """An earlier reasoning output item sent back in `input` (its text goes to the next assistant turn)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["reasoning"]
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None
    id: Text | None = None
    encrypted_content: None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ReasoningParam(BaseModel):
    """`reasoning`: the effort goes to the chat template as `reasoning_effort` (templates that read it)."""

    model_config = ConfigDict(extra="forbid")
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None  # (the reasoning is given whole)
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


def _item_kind(v: Any) -> str:
    """Which item of `input` a value is, by its `type` (a message may have none)."""
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return {"function_call": "FunctionCallItem", "function_call_output": "FunctionCallOutputItem",
            "reasoning": "ReasoningItemIn"}.get(kind if isinstance(kind, str) else "", "InputMessage")


InputItem = Annotated[Annotated[InputMessage, Tag("InputMessage")]
                      | Annotated[FunctionCallItem, Tag("FunctionCallItem")]
                      | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutputItem")]
                      | Annotated[ReasoningItemIn, Tag("ReasoningItemIn")], Discriminator(_item_kind)]

# fields of OpenAI's CreateResponse that concern what this server does not do: null (or their "off" value) is
# accepted, anything else refused by name
_RESPONSES_OFF: dict[str, tuple[Any, ...]] = {
    "include": (None, []), "background": (None, False),
    "prompt": (None,), "conversation": (None,), "truncation": (None, "disabled"), "top_logprobs": (None, 0),
    "context_management": (None,), "max_tool_calls": (None,)}


class ResponsesRequest(BaseModel):
    """OpenAI's CreateResponse, text in and text out. The prompt: `instructions` as a system message, then
    `input` (a string: one user message), through the chat template as /v1/chat/completions renders the same
    messages. Nothing is stored: `store` is accepted and ignored, `previous_response_id` refused (there is no
    earlier response to continue: send the whole conversation in `input`). `metadata` is echoed in the
    response. `seed` is an extension (as chat's)."""

    model_config = ConfigDict(extra="forbid")

    model: Text
    input: Text | Annotated[list[InputItem], Field(min_length=1)]
    instructions: Text | None = None
    max_output_tokens: MaxTokens | None = None  # None: up to the context's end
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stream: StrictBool | None = None
    stream_options: ResponseStreamOptions | None = None
    text: ResponseText | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None  # None: true
    reasoning: ReasoningParam | None = None
    chat_template_kwargs: dict[Text, Any] | None = None  # (as chat's)
    metadata: Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[Text, Field(max_length=512)]],
                        Field(max_length=16)] | None = None
    previous_response_id: Text | None = None
    # only OpenAI's service uses these: accepted and ignored
    store: StrictBool | None = None
    user: Text | None = None
    safety_identifier: Text | None = None
    prompt_cache_key: Text | None = None
    prompt_cache_retention: Text | None = None
    service_tier: Text | None = None
    # refused unless off (_RESPONSES_OFF)
    include: Any = None
    background: Any = None
    prompt: Any = None
    conversation: Any = None
    truncation: Any = None
    top_logprobs: Any = None
    context_management: Any = None
    max_tool_calls: Any = None

    @field_validator(*_RESPONSES_OFF)
    @classmethod
    def _off(cls, v: Any, info: ValidationInfo) -> Any:
        name = str(info.field_name)
        if not any(v == off and type(v) is type(off) for off in _RESPONSES_OFF[name]):
            raise ValueError("not supported by this server (text in, text out)")
        return v

    @field_validator("previous_response_id")
    @classmethod
    def _previous(cls, v: str | None) -> str | None:
        if v is not None:
            raise ValueError("this server stores no responses, so there is none to continue: send the whole "
                             "conversation in input")
        return v

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: ResponseStreamOptions | None, info: ValidationInfo) -> ResponseStreamOptions | None:
        if v is not None and not info.data.get("stream"):
            raise ValueError("only allowed when stream is true")
        return v

    _template_kwargs = field_validator("chat_template_kwargs")(
        ChatRequest._template_kwargs.__func__)  # type: ignore[attr-defined]

    @model_validator(mode="after")
    def _tool_choice(self) -> ResponsesRequest:
        check_tools([t.model_dump() for t in self.tools or []], self.choice())
        fmt = self.text.format if self.text else None
        if self.choice() not in ("none", "auto") and fmt is not None and fmt.type != "text":
            raise ValueError("text.format: a json format cannot go with a tool_choice that forces a call")
        return self

    def choice(self) -> str:
        """tool_choice as "none", "auto", "required" or the named function's name."""
        c = self.tool_choice
        if c is None:
            return "auto" if self.tools else "none"
        return c if isinstance(c, str) else c.name

    def function_tools(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True, exclude={"type"}) for t in self.tools or []]

    def template_kwargs(self) -> dict[str, Any]:
        kw = dict(self.chat_template_kwargs or {})
        if self.reasoning is not None and self.reasoning.effort is not None:
            kw.setdefault("reasoning_effort", self.reasoning.effort)
        return kw

    def messages(self) -> list[ChatMessage]:
        """The conversation as chat messages: instructions (a system message) first, then the input; function
        calls join the assistant turn they follow (or make one), function outputs are tool messages, and a
        reasoning item's text goes with the next assistant turn."""
        head = [ChatMessage(role="system", content=self.instructions)] if self.instructions is not None else []
        if isinstance(self.input, str):
            return [*head, ChatMessage(role="user", content=self.input)]
        out: list[ChatMessage] = list(head)
        reasoning: str | None = None
        for item in self.input:
            if isinstance(item, ReasoningItemIn):
                reasoning = "".join(p.text for p in item.content or item.summary)
            elif isinstance(item, FunctionCallItem):
                call = ToolCallIn(id=item.call_id, function=FunctionCallIn(name=item.name, arguments=item.arguments))
                last = out[-1] if out else None
                if last is not None and last.role == "assistant" and (last.tool_calls or reasoning is None):
                    last.tool_calls = [*(last.tool_calls or []), call]
                else:
                    out.append(ChatMessage(role="assistant", content=None, tool_calls=[call],
                                           reasoning_content=reasoning))
                    reasoning = None
            elif isinstance(item, FunctionCallOutputItem):
                out.append(ChatMessage(role="tool", content=item.text(), tool_call_id=item.call_id))
            else:
                msg = ChatMessage(role=item.role, content=item.text())
                if item.role == "assistant" and reasoning is not None:
                    msg.reasoning_content, reasoning = reasoning, None
                out.append(msg)
        return out

    def sampling(self) -> SamplingRequest:
        """The sampling fields as the other endpoints carry them."""
        return SamplingRequest(model=self.model, temperature=self.temperature, top_p=self.top_p, seed=self.seed)

    def response_format(self) -> ResponseFormat | None:
        return self.text.format.response_format() if self.text and self.text.format else None


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallOutput(BaseModel):
    """A function_call output item."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ReasoningOutput(BaseModel):
    """A reasoning output item: the model's thinking, whole (`content`), no summary."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = []
    content: list[dict[str, str]] = []
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int

    @classmethod
    def of(cls, prompt: int, completion: int) -> ResponseUsage:
        return cls(input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion)


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseErrorInfo(BaseModel):
    code: Literal["server_error", "invalid_prompt"]
    message: str


class ResponseObject(BaseModel):
    """OpenAI's Response: the request's settings echoed, the output message and usage."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    completed_at: int | None = None
    error: ResponseErrorInfo | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[ReasoningOutput | OutputMessage | FunctionCallOutput]
    parallel_tool_calls: bool
    previous_response_id: None = None
    reasoning: dict[str, Any] | None = None
    temperature: float
    top_p: float
    text: dict[str, Any]
    tool_choice: str | dict[str, str]
    tools: list[dict[str, Any]] = []
    truncation: Literal["disabled"] = "disabled"
    background: bool = False
    metadata: dict[str, str]
    usage: ResponseUsage | None = None
