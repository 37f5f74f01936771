"""OpenAI completions and chat completions over the engine, without HTTP: a request body in, a
response body (a dict) or a stream of SSE events (bytes) out; errors raised as `ApiError`.

The API behaviour is the CPU engine's (docs/cpu-engine.md#api-behaviour): the same fields, 400
naming the parameter (and naming what it does not do: `refuse_unsupported`, and besides
log-probabilities, the frequency/presence penalties and logit_bias, which the CPU engine does),
404 `model_not_found`, 400 `context_length_exceeded`, 429 `queue_full`
with Retry-After, and a client that disconnects frees its sequence at once. Besides, a request
with `"kv_transfer_params": {"do_remote_decode": true}` is a prefill for a remote decode (vLLM's
disaggregated shape): the prompt is computed, one token sampled and answered (never streamed),
and the prompt's KV kept under a handle that the response's `kv_transfer_params` names.

Once the shutdown drain's deadline passes (serving_limits.Drain), a running request is ended as
the CPU engine ends it: its sequence aborted, a last delta with finish_reason `abort` (streamed:
a final chunk and `[DONE]`; otherwise the text so far).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from ..cpu_engine.runner import Delta, PromptTooLong, QueueFull, SamplingParams
from ..cpu_engine.tokenizer import GGUFTokenizer
from ..kv_handoff.export import KvExports
from ..protocol.openai import (
    SSE_DONE,
    ApiError,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    ChunkDelta,
    CommonRequest,
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    ModelCard,
    ModelList,
    Usage,
    refuse_unsupported,
    sse,
    sse_error,
)
from ..serving_limits import Drain
from .engine import PrefillEngine
from .kv_export import KvDescription, export_kept
from .sequence import Sequence

# How often a request checks that its client is still there (and the drain's deadline).
DISCONNECT_POLL_SECONDS = 0.25

IsDisconnected = Callable[[], Awaitable[bool]]


@dataclass
class ServedModel:
    name: str
    max_model_len: int
    created: int
    port: int  # answered as `remote_port` of the KV handles


def parse(model_type: type[BaseModel], payload: Any) -> Any:
    if not isinstance(payload, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return model_type.model_validate(payload)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(400, f"{param}: {first['msg']}", param=param) from None


class OpenAIServing:
    def __init__(self, served: ServedModel, engine: PrefillEngine, tokenizer: GGUFTokenizer,
                 exports: KvExports, kv: KvDescription,
                 on_finish: Callable[[str], None] = lambda _reason: None,
                 drain: Drain | None = None):
        self.served, self.engine, self.tokenizer = served, engine, tokenizer
        self.exports, self.kv, self.on_finish = exports, kv, on_finish
        self.drain = drain or Drain()

    def models(self) -> dict:
        return ModelList(data=[ModelCard(id=self.served.name, created=self.served.created,
                                         max_model_len=self.served.max_model_len)]).model_dump()

    async def create(self, payload: Any, chat: bool, is_disconnected: IsDisconnected
                     ) -> dict | AsyncIterator[bytes]:
        """A response body, or the SSE events of a streamed one."""
        req = parse(ChatRequest if chat else CompletionRequest, payload)
        if req.model != self.served.name:
            raise ApiError(404, f"The model `{req.model}` does not exist.", param="model",
                           code="model_not_found")
        refuse_unsupported(req)
        self._refuse_sampling_extras(req)
        remote_decode = self._remote_decode(req)
        prompt_ids = self._prompt(req, chat)
        sampling = self._sampling(req, len(prompt_ids), chat, remote_decode)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        queue: asyncio.Queue[Delta] = asyncio.Queue()
        seq = self._add(prompt_ids, sampling, remote_decode, queue)
        deltas = self._deltas(seq, queue, is_disconnected)
        first = await anext(deltas)  # errors surface here, before any byte is sent
        if req.stream:
            return self._events(req, chat, rid, created, len(prompt_ids), first, deltas)
        body = await self._body(req, chat, rid, created, len(prompt_ids), _chain(first, deltas))
        if remote_decode and seq.id in self.engine.kept:
            # No await since the last delta: the kept KV is still ours to hand over.
            params = export_kept(self.exports, self.engine, self.kv, seq, self.served.port)
            body["kv_transfer_params"] = params.model_dump()
        return body

    async def _body(self, req: CommonRequest, chat: bool, rid: str, created: int,
                    prompt_len: int, deltas: AsyncIterator[Delta]) -> dict:
        text, count, reason = "", 0, None
        async for delta in deltas:
            text += delta.text
            reason = delta.finish_reason or reason
            count = delta.completion_tokens if delta.completion_tokens is not None else count
        usage = Usage.of(prompt_len, count)
        name = self.served.name
        if chat:
            return ChatCompletion(id=rid, created=created, model=name, usage=usage,
                                  choices=[ChatChoice(message=AssistantMessage(content=text),
                                                      finish_reason=reason)]).model_dump()
        echo = req.prompt if req.echo and isinstance(req.prompt, str) else ""
        return Completion(id=rid, created=created, model=name, usage=usage,
                          choices=[CompletionChoice(text=echo + text,
                                                    finish_reason=reason)]).model_dump()

    # -- request -> engine input ---------------------------------------------------------------
    @staticmethod
    def _refuse_sampling_extras(req: CommonRequest) -> None:
        """What the CPU engine samples with and this engine does not (yet): refused by name."""
        for param, asked in (("logprobs", req.top_logprob_count is not None),
                             ("frequency_penalty", req.frequency_penalty != 0),
                             ("presence_penalty", req.presence_penalty != 0),
                             ("logit_bias", bool(req.logit_bias))):
            if asked:
                raise ApiError(400, f"{param}: not supported by the builtin prefill engine",
                               param=param)

    def _remote_decode(self, req: CommonRequest) -> bool:
        """Whether the request is a prefill for a remote decode (the CPU engine's checks)."""
        params = req.kv_transfer_params
        if params is None:
            return False
        if params.do_remote_prefill:
            raise ApiError(400, "kv_transfer_params: this engine does not import KV "
                           "(do_remote_prefill); send it to a decode engine",
                           param="kv_transfer_params")
        if not params.do_remote_decode:
            return False
        if not self.exports.enabled:
            raise ApiError(400, "kv_transfer_params: this engine does not export KV (start it "
                           "with --kv-token-file)", param="kv_transfer_params")
        if req.stream:
            raise ApiError(400, "kv_transfer_params: a prefill for a remote decode is not "
                           "streamed (stream: false)", param="kv_transfer_params")
        return True

    def _prompt(self, req: CommonRequest, chat: bool) -> list[int]:
        tok = self.tokenizer
        if chat:
            text = tok.render_chat([{"role": m.role, "content": m.text()} for m in req.messages])
            return tok.encode(text, add_bos=False)
        if isinstance(req.prompt, list):
            if any(t < 0 or t >= self.engine.n_vocab for t in req.prompt):
                raise ApiError(400, "prompt: token ids out of the vocabulary", param="prompt")
            return list(req.prompt)
        return tok.encode(req.prompt)

    def _sampling(self, req: CommonRequest, prompt_len: int, chat: bool, remote_decode: bool
                  ) -> SamplingParams:
        limit = 1 if remote_decode else req.completion_limit
        max_len = self.served.max_model_len
        room = max_len - prompt_len
        if room < 1:
            raise ApiError(400, f"This model's maximum context length is {max_len} tokens. "
                           f"However, your prompt has {prompt_len} tokens.",
                           param="messages" if chat else "prompt",
                           code="context_length_exceeded")
        if limit is not None and prompt_len + limit > max_len:
            raise ApiError(400, f"This model's maximum context length is {max_len} tokens. "
                           f"However, you requested {prompt_len + limit} tokens ({prompt_len} "
                           f"in the prompt, {limit} for the completion).", param="max_tokens",
                           code="context_length_exceeded")
        return SamplingParams(max_tokens=limit or room, temperature=req.temperature,
                              top_k=max(req.top_k, 0), top_p=req.top_p, seed=req.seed,
                              stop=req.stops(), ignore_eos=req.ignore_eos)

    # -- engine output -------------------------------------------------------------------------
    def _add(self, prompt_ids: list[int], sampling: SamplingParams, keep_kv: bool,
             queue: asyncio.Queue[Delta]) -> Sequence:
        loop = asyncio.get_running_loop()
        try:
            return self.engine.add(prompt_ids, sampling,
                                   lambda d: loop.call_soon_threadsafe(queue.put_nowait, d),
                                   keep_kv=keep_kv)
        except QueueFull as error:
            raise ApiError(429, f"the engine is at capacity: {error}; retry later",
                           code="queue_full", headers={"Retry-After": "1"}) from None
        except PromptTooLong as error:
            raise ApiError(400, str(error), param="prompt", code="context_length_exceeded") \
                from None

    async def _deltas(self, seq: Sequence, queue: asyncio.Queue[Delta],
                      is_disconnected: IsDisconnected) -> AsyncIterator[Delta]:
        """The sequence's deltas until its last; the sequence is aborted if this ends early
        (the client went away, the handler was cancelled)."""
        loop = asyncio.get_running_loop()
        done = False
        try:
            checked = loop.time()
            while True:
                try:
                    delta = await asyncio.wait_for(queue.get(), timeout=DISCONNECT_POLL_SECONDS)
                except TimeoutError:
                    delta = None
                # Polled by time, not only when idle: a non-streaming request whose client left
                # would otherwise decode to max_tokens for nobody.
                if loop.time() - checked >= DISCONNECT_POLL_SECONDS:
                    checked = loop.time()
                    if await is_disconnected():
                        raise asyncio.CancelledError
                    if self.drain.expired() and not (delta and delta.finish_reason):
                        if delta is not None:
                            yield delta
                        done = True  # the finally's abort is the one below, not a second
                        self.engine.abort(seq.id)
                        self.on_finish("abort")
                        yield Delta("", [], "abort", len(seq.output_ids))
                        return
                if delta is None:
                    continue
                if delta.finish_reason == "error":
                    raise ApiError(500, "the engine failed while computing this request",
                                   code="engine_error")
                if delta.finish_reason:
                    done = True
                    self.on_finish(delta.finish_reason)
                yield delta
                if done:
                    return
        finally:
            # Once the last delta is out, a kept KV belongs to the caller, which puts it under
            # a handle with no await in between; before that, the engine frees it.
            if not done:
                self.engine.abort(seq.id)

    def _events(self, req: CommonRequest, chat: bool, rid: str, created: int, prompt_len: int,
                first: Delta, deltas: AsyncIterator[Delta]) -> AsyncIterator[bytes]:
        name = self.served.name
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(text: str | None, reason: str | None, role: bool = False):
            if chat:
                delta = ChunkDelta(role="assistant" if role else None, content=text)
                return ChatCompletionChunk(id=rid, created=created, model=name,
                                           choices=[ChatChunkChoice(delta=delta,
                                                                    finish_reason=reason)])
            return CompletionChunk(id=rid, created=created, model=name,
                                   choices=[CompletionChoice(text=text or "",
                                                             finish_reason=reason)])

        async def events() -> AsyncIterator[bytes]:
            count = 0
            if chat:
                yield sse(chunk("", None, role=True))
            try:
                async for delta in _chain(first, deltas):
                    if delta.completion_tokens is not None:
                        count = delta.completion_tokens
                    yield sse(chunk(delta.text or None, delta.finish_reason))
            except ApiError as error:
                yield sse_error(error)
                return
            finally:
                await deltas.aclose()  # a stream closed early aborts its sequence
            if include_usage:
                last = chunk(None, None)
                yield sse(last.model_copy(update={"choices": [],
                                                  "usage": Usage.of(prompt_len, count)}))
            yield SSE_DONE

        return events()


async def _chain(first: Delta, rest: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
    yield first
    async for delta in rest:
        yield delta
