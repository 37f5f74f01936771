"""OpenAI wire models: request bodies (the fields heteroserve's engines honour), responses,
stream chunks, the error shape, and the server-sent-events encoder.

Requests ignore unknown fields (clients send many), and declare the fields that change what a
client gets back, so that an engine can refuse what it does not do (`refuse_unsupported`)
instead of ignoring it: the router validates with the same models and forwards to engines that
may do more (vLLM), so the models accept those fields and each engine decides. Everything the
engines answer is built from the response models here, so the router and the engines speak one
dialect.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .kv import KvTransferParams

# -- errors ---------------------------------------------------------------------------------------


class ErrorBody(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """`{"error": {message, type, param, code}}`: every non-2xx answer, 404 and 405 included."""

    error: ErrorBody


# OpenAI's error `type` per HTTP status, for errors raised without an explicit one.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "invalid_request_error",
               405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
               429: "rate_limit_error", 500: "server_error", 501: "server_error",
               502: "server_error", 503: "server_error", 504: "timeout_error"}


class ApiError(Exception):
    """An error answered in OpenAI's shape; `headers` (e.g. Retry-After) go on the response."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, kind: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or ERROR_TYPES.get(status, "server_error")
        self.headers = dict(headers or {})

    def response(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorBody(message=self.message, type=self.kind,
                                             param=self.param, code=self.code))

    def body(self) -> dict[str, Any]:
        return self.response().model_dump()


# -- requests -------------------------------------------------------------------------------------

# A JSON `\uD800`-`\uDFFF` escape: only a body with one can hold a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _lone_surrogate(payload: object) -> str | None:
    """The dotted path of the first string (key or value) holding a lone UTF-16 surrogate,
    which JSON can escape but UTF-8 cannot carry; None when there is none. Iterative: the
    payload may be as deep as the JSON parser allows."""
    stack: list[tuple[str, object]] = [("", payload)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return path or "body"
        elif isinstance(value, dict):
            for key, item in value.items():
                stack.append((f"{path}.{key}" if path else str(key), key))
                stack.append((f"{path}.{key}" if path else str(key), item))
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}" if path else str(i), item)
                         for i, item in enumerate(value))
    return None


def parse_body(raw: bytes) -> dict:
    """The request body as a JSON object, or an OpenAI-shaped 400."""
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply") from None
    if not isinstance(payload, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw):
        where = _lone_surrogate(payload)
        if where is not None:
            param = where.encode("utf-8", errors="backslashreplace").decode()[:200]
            raise ApiError(400, f"{param}: a lone UTF-16 surrogate (such as \\ud800) is not "
                           "valid Unicode", param=param)
    return payload





class StreamOptions(BaseModel):
    include_usage: bool = False


class CommonRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=-1, le=2**31 - 1)  # 0 or -1 (vLLM's): off
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)
    ignore_eos: bool = False
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    # Token id (a decimal string) -> -100..100, added to its logit (checked by token_bias).
    logit_bias: dict[str, float] | None = None
    # The KV hand-off (vLLM's disaggregated-serving field): do_remote_decode asks a prefill
    # engine to keep the prompt's KV; do_remote_prefill tells a decode engine where to pull it.
    kv_transfer_params: KvTransferParams | None = None
    # vLLM's sampling extras: no heteroserve engine does them (refuse_unsupported).
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    prompt_logprobs: Any = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def top_logprob_count(self) -> int | None:
        """None: no log-probabilities; k: the sampled token's and the k most probable ones."""
        return None

    def token_bias(self, n_vocab: int) -> dict[int, float]:
        """`logit_bias` with integer ids, or a 400 naming it (OpenAI's rules: ids of the
        vocabulary, values from -100 to 100)."""
        bias: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit()) or int(key) >= n_vocab:
                raise ApiError(400, f"logit_bias: {key[:40]!r} is not a token id of this "
                               f"model (0 to {n_vocab - 1})", param="logit_bias")
            if not -100 <= value <= 100:
                raise ApiError(400, f"logit_bias: the bias of token {key} is {value}; it must "
                               "be from -100 to 100", param="logit_bias")
            bias[int(key)] = value
        return bias


MAX_TOP_LOGPROBS = 20  # OpenAI's top_logprobs maximum (vLLM's default max_logprobs)


class CompletionRequest(CommonRequest):
    prompt: str | list[int]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = None
    suffix: str | None = None

    @property
    def top_logprob_count(self) -> int | None:
        return self.logprobs


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = ""

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.get("text", "") for part in self.content
                           if part.get("type") == "text")
        return self.content or ""


class ChatRequest(CommonRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None

    @property
    def top_logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def refuse_unsupported(req: CommonRequest) -> None:
    """A 400 naming the first parameter whose value asks for what no heteroserve engine does
    (tool calls, constrained decoding, several candidates, insertion, non-text input, vLLM's
    sampling extras), instead of silently answering as if it had not been sent. Harmless
    values pass: tools with `tool_choice: "none"`, `response_format: {"type": "text"}`,
    `best_of: 1`, an empty `suffix`, `repetition_penalty: 1`."""
    def refuse(param: str, message: str) -> None:
        raise ApiError(400, f"{param}: {message}", param=param)

    if isinstance(req, ChatRequest):
        if req.top_logprobs is not None and not req.logprobs:
            refuse("top_logprobs", "needs `logprobs: true`")
        choice = req.tool_choice
        if req.tools and choice != "none":
            if choice in (None, "auto"):
                refuse("tools", "this engine does not call tools (no tool-call parser): send "
                       "`tool_choice: \"none\"` to answer in text, or no tools")
            refuse("tool_choice", f"{str(choice)[:80]} needs tool calls, which this engine does "
                   "not make")
        if req.functions and req.function_call != "none":
            refuse("functions", "this engine does not call functions")
        if req.response_format and req.response_format.get("type", "text") != "text":
            refuse("response_format", f"{str(req.response_format.get('type'))[:40]} needs "
                   "constrained decoding, which this engine does not do; only "
                   "{\"type\": \"text\"} is accepted")
        for i, message in enumerate(req.messages):
            if isinstance(message.content, list):
                for j, part in enumerate(message.content):
                    if part.get("type") != "text" or not isinstance(part.get("text"), str):
                        refuse(f"messages.{i}.content.{j}", "only text parts (`{\"type\": "
                               "\"text\", \"text\": ...}`) are accepted: this model reads no "
                               f"{str(part.get('type'))[:40]}")
    else:
        assert isinstance(req, CompletionRequest)
        if req.best_of is not None and req.best_of > 1:
            refuse("best_of", "one candidate per request only (best_of 1)")
        if req.suffix:
            refuse("suffix", "insertion after a suffix is not supported")
        if req.echo and req.logprobs is not None:
            refuse("echo", "echo with logprobs needs the prompt's log-probabilities, which this "
                   "engine does not compute")
    if req.repetition_penalty != 1.0:
        refuse("repetition_penalty", "not supported; use frequency_penalty or presence_penalty")
    if req.min_p != 0.0:
        refuse("min_p", "not supported; use top_p or top_k")
    if req.min_tokens:
        refuse("min_tokens", "not supported")
    for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
                 "structured_outputs"):
        if getattr(req, name) is not None:
            refuse(name, "constrained decoding is not supported")
    if req.prompt_logprobs is not None:
        refuse("prompt_logprobs", "the prompt's log-probabilities are not computed")


# -- responses ------------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt: int, completion: int) -> Usage:
        return cls(prompt_tokens=prompt, completion_tokens=completion,
                   total_tokens=prompt + completion)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None  # the token's UTF-8 bytes (a token may hold part of a char)


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: parallel lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChunk(BaseModel):
    """Streamed legacy completions reuse the `text_completion` object with a partial text."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "heteroserve"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# -- server-sent events ---------------------------------------------------------------------------

SSE_DONE = b"data: [DONE]\n\n"
SSE_MEDIA_TYPE = "text/event-stream"


def sse(payload: BaseModel | dict[str, Any]) -> bytes:
    """One `data:` event. A chunk carries `usage` only when set (the last one, on request) and
    its delta only the fields set; `finish_reason` is always present (null until the end)."""
    data = payload.model_dump() if isinstance(payload, BaseModel) else payload
    if "usage" in data and data["usage"] is None:
        data = {k: v for k, v in data.items() if k != "usage"}
    for choice in data.get("choices") or ():
        delta = choice.get("delta")
        if delta:
            choice["delta"] = {k: v for k, v in delta.items() if v is not None}
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def sse_error(error: ApiError) -> bytes:
    """The event that ends a stream broken after its first byte (vLLM sends the same shape)."""
    return sse(error.response())
