"""OpenAI's request and response shapes for /v1/completions, /v1/chat/completions and /v1/models,
and OpenAI's error body. Requests are validated strictly: an unknown field, a wrong type or a value
out of range is refused (HTTP 400, naming the field), and so are the OpenAI options this server does
not implement (n > 1, echo, logprobs, penalties, logit_bias, best_of, suffix, tools). `top_k` and
`ignore_eos` are extensions (as in vLLM)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

from ..errors import WebtensorError

MAX_STOP = 4  # OpenAI's limit on stop sequences


class APIError(WebtensorError):
    """An error the HTTP client gets back as OpenAI's body {"error": {message, type, param, code}}."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return self.TYPES.get(self.status, "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def validation_error(errors: list[dict[str, Any]]) -> APIError:
    """An APIError (400) from pydantic / FastAPI validation errors: the first one, by field."""
    e = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": "invalid"}
    loc = [str(p) for p in e.get("loc", ()) if p != "body" and not _type_tag(str(p))]
    if e.get("type") == "json_invalid":
        return APIError(400, f"malformed JSON in the request body: {e.get('ctx', {}).get('error', e['msg'])}",
                        code="invalid_json")
    param = ".".join(loc) or None
    msg = str(e.get("msg", "invalid value"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return APIError(400, f"{param}: {msg}" if param else msg, param=param, code=str(e.get("type", "invalid")))


def _type_tag(part: str) -> bool:
    """pydantic names the union member that failed in an error's location ("str", "list[int]"): skip it."""
    return part in ("str", "int", "float", "bool", "list", "dict", "none") or "[" in part or "-" in part


# -- requests -----------------------------------------------------------------------------------------
Temperature = Annotated[float, Field(ge=0.0, le=2.0, strict=True)]
TopP = Annotated[float, Field(gt=0.0, le=1.0, strict=True)]
Stop = StrictStr | list[StrictStr] | None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class SamplingRequest(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr
    temperature: Temperature | None = None  # None: 1.0, as OpenAI
    top_p: TopP | None = None
    top_k: Annotated[int, Field(ge=1, strict=True)] | None = None  # extension
    seed: StrictInt | None = None
    stop: Stop = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: StrictStr | None = None
    ignore_eos: StrictBool = False  # extension: generate max_tokens even past <|endoftext|>

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Stop) -> Stop:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences, got {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("a stop sequence must not be empty")
        return v

    @field_validator("n")
    @classmethod
    def _n(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError(f"only n=1 is supported, got {v}")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, v: float | None) -> float | None:
        if v not in (None, 0, 0.0):
            raise ValueError("penalties are not supported (only 0)")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            raise ValueError("logit_bias is not supported")
        return v

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


Prompt = StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    max_tokens: Annotated[int, Field(ge=1, strict=True)] | None = None  # None: 16 (fewer where the context ends first)
    echo: StrictBool | None = None
    logprobs: StrictInt | None = None
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Prompt) -> Prompt:
        if isinstance(v, list) and v and isinstance(v[0], str | list):
            if len(v) != 1:
                raise ValueError(f"one prompt per request is supported, got a batch of {len(v)}")
        return v

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError("echo is not supported")
        return v

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: int | None) -> int | None:
        if v is not None:
            raise ValueError("logprobs is not supported")
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

    def prompt_value(self) -> str | list[int]:
        """The one prompt: text or token ids."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            return p[0]  # type: ignore[return-value]
        return p  # type: ignore[return-value]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1, strict=True)] | None = None  # None: up to the context's end
    max_completion_tokens: Annotated[int, Field(ge=1, strict=True)] | None = None
    logprobs: StrictBool | None = None

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError("logprobs is not supported")
        return v

    def max_new(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# -- responses ----------------------------------------------------------------------------------------
FinishReason = Literal["stop", "length"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt: int, completion: int) -> Usage:
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: FinishReason | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "webtensor"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
