"""OpenAI wire models: request bodies (the fields heteroserve's engines honour), responses,
stream chunks, the error shape, and the server-sent-events encoder.

Requests ignore unknown fields (clients send many); everything the engines answer is built from
the response models here, so the router and the engines speak one dialect.
"""

from __future__ import annotations

import json
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


class StreamOptions(BaseModel):
    include_usage: bool = False


class CommonRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0, le=2**31 - 1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)
    ignore_eos: bool = False
    # The KV hand-off (vLLM's disaggregated-serving field): do_remote_decode asks a prefill
    # engine to keep the prompt's KV; do_remote_prefill tells a decode engine where to pull it.
    kv_transfer_params: KvTransferParams | None = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(CommonRequest):
    prompt: str | list[int]
    echo: bool = False


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


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: None = None


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
