"""The OpenAI-compatible HTTP server of the CPU engine (Starlette on uvicorn).

Routes: /v1/completions, /v1/chat/completions (streaming and not), /v1/models, /health,
/metrics. Errors use OpenAI's shape: 400 naming the bad parameter (or a parameter the engine
does not do: `refuse_unsupported`), 404 `model_not_found`, 400 `context_length_exceeded` for
prompts longer than the context, 413 for a body over `--max-body-bytes` (answered before the
rest is read), 429 when the queue is full (checked before the body is parsed, so that refusals
are cheap under overload), 503 while draining, and a 500 of the same shape with
`Connection: close` for anything unexpected. A client that disconnects, streaming or not, frees
its sequence at the engine's next step: each request watches its ASGI receive channel for
`http.disconnect` while it generates (`generate`). Tokenizing runs on worker threads, so a long
prompt never holds up the event loop.

On SIGTERM the server drains (`Drain`): it stops admitting, lets running requests finish for
`--drain-seconds`, then ends what is left with a final chunk (finish_reason `abort`) and
`[DONE]`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..protocol.openai import (
    SSE_DONE,
    SSE_MEDIA_TYPE,
    ApiError,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    ChatRequest,
    ChatTokenLogprob,
    ChunkDelta,
    CommonRequest,
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionRequest,
    ModelCard,
    ModelList,
    TopLogprob,
    Usage,
    parse_body,
    refuse_unsupported,
    sse,
    sse_error,
)

# Shared with the prefill engine; __main__ imports the defaults and serve from here.
from ..serving_limits import (
    DRAIN_SECONDS,  # noqa: F401
    MAX_BODY_BYTES,
    Drain,
    Guard,
    error_response,
    serve,  # noqa: F401
)
from .handoff import KvHandoff
from .runner import (
    Delta,
    EngineCore,
    ImportedKv,
    PromptTooLong,
    QueueFull,
    SamplingParams,
    TokenLogprob,
)
from .tokenizer import ChatTemplateError, GGUFTokenizer

log = logging.getLogger("heteroserve.cpu_engine")

# How often a request that has no new output checks the drain's deadline.
DRAIN_POLL_SECONDS = 0.25
# OpenAI's (and vLLM's) stand-in for a log-probability of minus infinity (JSON has none).
LOGPROB_FLOOR = -9999.0


@dataclass
class ServerLimits:
    max_body_bytes: int = MAX_BODY_BYTES
    drain: Drain = field(default_factory=Drain)


@dataclass
class ServedModel:
    name: str
    engine: EngineCore
    tokenizer: GGUFTokenizer
    max_model_len: int
    created: int
    handoff: KvHandoff | None = None  # the KV hand-off (import, and export for a pull)


class EngineLoad(Collector):
    """Running and waiting requests, read live at scrape time (not the last step's copy, which
    stays stale once idle) and together (`EngineCore.load`): a request being admitted or
    preempted never shows in neither gauge or in both, so their sum, which routers and
    admission count, is exact in every scrape."""

    def __init__(self, served: ServedModel):
        self.served = served

    def collect(self):
        running, waiting = self.served.engine.load()
        labels = [self.served.name]
        for name, doc, value in (
                ("vllm:num_requests_running", "Sequences being decoded or prefilled", running),
                ("vllm:num_requests_waiting", "Requests waiting for admission", waiting)):
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(labels, value)
            yield family


class EngineCounters(Collector):
    """The engine's running totals as Prometheus counters under vLLM's names (read from the
    engine's own stats at scrape time, so they can never drift from them)."""

    def __init__(self, served: ServedModel):
        self.served = served

    def collect(self):
        stats, labels = self.served.engine.stats, [self.served.name]
        for name, doc, value in (
                ("vllm:prompt_tokens", "Prompt tokens computed", stats.prompt_tokens),
                ("vllm:generation_tokens", "Tokens generated", stats.generated_tokens),
                ("vllm:num_preemptions", "Sequences preempted (KV cache full; recomputed "
                 "later)", stats.preemptions),
                ("heteroserve:kv_imported_tokens", "Prompt tokens whose KV was imported from "
                 "another engine (not computed here)", stats.imported_tokens)):
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(labels, value)
            yield family


class Metrics:
    """vLLM-style metric names, so routers read both engines alike."""

    def __init__(self, registry: CollectorRegistry, served: ServedModel):
        self.registry, self.served = registry, served
        engine = served.engine
        labels = {"model_name": served.name}
        registry.register(EngineLoad(served))
        Gauge("vllm:kv_cache_usage_perc", "KV-cache usage fraction (0-1)", ["model_name"],
              registry=registry).labels(**labels).set_function(lambda: engine.allocator.usage)
        Gauge("heteroserve:generated_tokens", "Tokens generated since start", ["model_name"],
              registry=registry).labels(**labels).set_function(
                  lambda: engine.stats.generated_tokens)
        Gauge("heteroserve:prompt_tokens", "Prompt tokens computed since start", ["model_name"],
              registry=registry).labels(**labels).set_function(lambda: engine.stats.prompt_tokens)
        registry.register(EngineCounters(served))
        buckets = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token",
                              ["model_name"], buckets=buckets, registry=registry).labels(**labels)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between output tokens",
                             ["model_name"], buckets=buckets, registry=registry).labels(**labels)
        self.decode_batch = Histogram(
            "heteroserve:decode_batch_size", "Sequences that got a token in one engine step "
            "(continuous batching; steps that sample none are not counted)", ["model_name"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=registry).labels(**labels)
        self.requests = Counter("heteroserve:requests", "Finished requests by finish reason "
                                "(abort: drained, or the client went away)",
                                ["model_name", "finish_reason"], registry=registry)
        self.histograms = {"ttft": self.ttft, "itl": self.itl, "decode_batch": self.decode_batch}

    def observe(self, name: str, value: float) -> None:
        """The engine's `observe` (EngineCore): a value for one of `histograms`."""
        self.histograms[name].observe(value)


def _parse(model_type, payload: dict):
    try:
        return model_type.model_validate(payload)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(400, f"{param}: {first['msg']}", param=param) from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply") from None


@dataclass
class Prepared:
    prompt_ids: list[int]
    sampling: SamplingParams


def queue_full(reason: str) -> ApiError:
    return ApiError(429, f"the engine is at capacity: {reason}; retry later", code="queue_full",
                    headers={"Retry-After": "1"})


def _logprob(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


class LogprobFormat:
    """Engine log-probabilities in OpenAI's two shapes."""

    def __init__(self, tokenizer: GGUFTokenizer):
        self.tok = tokenizer

    def chat(self, entries: list[TokenLogprob]) -> ChatLogprobs:
        def top(token_id: int, logprob: float) -> TopLogprob:
            return TopLogprob(token=self.tok.token_text(token_id), logprob=_logprob(logprob),
                              bytes=list(self.tok.token_bytes(token_id)))

        return ChatLogprobs(content=[ChatTokenLogprob(
            **top(e.token_id, e.logprob).model_dump(),
            top_logprobs=[top(i, lp) for i, lp in e.top]) for e in entries])

    def completion(self, entries: list[TokenLogprob], offset: int) -> CompletionLogprobs:
        """`offset`: where the first token's text starts in the choice's text."""
        tokens = [self.tok.token_text(e.token_id) for e in entries]
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        return CompletionLogprobs(
            tokens=tokens, token_logprobs=[_logprob(e.logprob) for e in entries],
            top_logprobs=[{self.tok.token_text(i): _logprob(lp) for i, lp in e.top}
                          for e in entries],
            text_offset=offsets)


def create_app(served: ServedModel, registry: CollectorRegistry,
               limits: ServerLimits | None = None):
    """The ASGI application: the routes behind the `Guard`."""
    limits = limits or ServerLimits()
    drain = limits.drain
    metrics = Metrics(registry, served)
    served.engine.observe = metrics.observe
    formats = LogprobFormat(served.tokenizer)

    def check_model(req: CommonRequest) -> None:
        if req.model != served.name:
            raise ApiError(404, f"The model `{req.model}` does not exist.", param="model",
                           code="model_not_found")

    def too_long(prompt_param: str, prompt_len: int) -> ApiError:
        return ApiError(400, f"This model's maximum context length is {served.max_model_len} "
                        f"tokens. However, your prompt has {prompt_len} tokens.",
                        param=prompt_param, code="context_length_exceeded")

    def params(req: CommonRequest, prompt_len: int) -> SamplingParams:
        limit = req.max_completion_tokens or req.max_tokens
        room = served.max_model_len - prompt_len
        if room < 1:
            raise too_long("messages" if isinstance(req, ChatRequest) else "prompt", prompt_len)
        if limit is not None and prompt_len + limit > served.max_model_len:
            raise ApiError(400, f"This model's maximum context length is {served.max_model_len} "
                           f"tokens. However, you requested {prompt_len + limit} tokens "
                           f"({prompt_len} in the prompt, {limit} for the completion).",
                           param="max_tokens", code="context_length_exceeded")
        return SamplingParams(max_tokens=limit or room, temperature=req.temperature,
                              top_k=max(req.top_k, 0), top_p=req.top_p, seed=req.seed,
                              stop=req.stops(), ignore_eos=req.ignore_eos,
                              frequency_penalty=req.frequency_penalty,
                              presence_penalty=req.presence_penalty,
                              logit_bias=req.token_bias(served.engine.n_vocab),
                              logprobs=req.top_logprob_count)

    def prepare(req: CommonRequest, chat: bool) -> Prepared:
        """Tokenizes and checks the prompt (on a worker thread: CPU-heavy for long prompts)."""
        tok = served.tokenizer
        param = "messages" if chat else "prompt"
        if chat:
            try:
                text = tok.render_chat([{"role": m.role, "content": m.text()}
                                        for m in req.messages])
            except ChatTemplateError as error:
                raise ApiError(400, str(error), param="messages") from None
            add_bos = False
        elif isinstance(req.prompt, list):
            if any(t < 0 or t >= served.engine.n_vocab for t in req.prompt):
                raise ApiError(400, "prompt: token ids out of the vocabulary", param="prompt")
            return Prepared(list(req.prompt), params(req, len(req.prompt)))
        else:
            text, add_bos = req.prompt, None
        # A text of n bytes has at least n / max_token_bytes tokens: one far over the context
        # is refused without encoding it.
        at_least = len(text.encode("utf-8")) // tok.max_token_bytes
        if at_least >= served.max_model_len:
            raise too_long(param, at_least)
        prompt_ids = tok.encode(text, add_bos=add_bos)
        return Prepared(prompt_ids, params(req, len(prompt_ids)))

    async def client_gone(request: Request) -> None:
        """Returns when the client has closed the connection (after the request body)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def generate(request: Request, prompt_ids: list[int], sampling: SamplingParams,
                       imported: ImportedKv | None = None, keep_kv: bool = False,
                       started: list | None = None) -> AsyncIterator[Delta]:
        """The sequence's deltas. Raises ClientDisconnect as soon as the client closes the
        connection (its sequence is aborted): streaming or not, nobody reads what is left.
        `started` receives the engine's Sequence (for the KV export after it finishes)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Delta | None] = asyncio.Queue()  # None: only a wake-up
        try:
            seq = served.engine.add(prompt_ids, sampling,
                                    lambda d: loop.call_soon_threadsafe(queue.put_nowait, d),
                                    imported=imported, keep_kv=keep_kv)
            if started is not None:
                started.append(seq)
        except QueueFull as error:
            raise queue_full(str(error)) from None
        except PromptTooLong as error:
            raise ApiError(400, str(error), param="prompt", code="context_length_exceeded") \
                from None
        # The body has been read, so the receive channel's next event is the disconnect: waited
        # for beside the output, not polled, so that a request that keeps producing (as a
        # non-streaming one does until max_tokens) still stops at once.
        gone = asyncio.create_task(client_gone(request))
        gone.add_done_callback(lambda _task: queue.put_nowait(None))
        reason = None  # the finish reason counted in heteroserve:requests
        try:
            while True:
                try:
                    delta = await asyncio.wait_for(queue.get(), timeout=DRAIN_POLL_SECONDS)
                except TimeoutError:
                    delta = None
                if gone.done() and not gone.cancelled():
                    raise ClientDisconnect
                if drain.expired() and not (delta and delta.finish_reason):
                    served.engine.abort(seq)
                    reason = "abort"
                    if delta is not None:
                        yield delta
                    yield Delta("", [], "abort", len(seq.output_ids),
                                logprobs=[] if sampling.logprobs is not None else None)
                    return
                if delta is None:
                    continue
                reason = delta.finish_reason
                yield delta
                if reason:
                    return
        finally:
            gone.cancel()
            if seq.finish_reason is None:
                served.engine.abort(seq)
            # None: the client went away (or the response was cancelled) before the end
            metrics.requests.labels(served.name, reason or "abort").inc()

    async def respond(request: Request, chat: bool) -> Response:
        arrived = time.monotonic()
        drain.refuse_new()
        body = await request.body()
        if served.engine.full():
            # Refused before the body is parsed and tokenized: under overload a 429 must cost
            # the engine's core next to nothing (tests/bench/engine_overload.py).
            raise queue_full(f"{len(served.engine.waiting)} requests are already waiting")
        req = _parse(ChatRequest if chat else CompletionRequest, parse_body(body))
        check_model(req)
        refuse_unsupported(req)
        prepared = await asyncio.to_thread(prepare, req, chat)
        prompt_ids, sampling = prepared.prompt_ids, prepared.sampling
        transfer, imported, keep_kv, started = req.kv_transfer_params, None, False, []
        if transfer and (transfer.do_remote_decode or transfer.do_remote_prefill):
            if served.handoff is None:
                raise ApiError(400, "kv_transfer_params: this engine has no KV hand-off",
                               param="kv_transfer_params")
            if transfer.do_remote_decode:  # a prefill for another engine: one token, KV kept
                served.handoff.check_export(req.stream)
                sampling.max_tokens, keep_kv = 1, True
            else:
                imported = await served.handoff.pull(transfer, prompt_ids)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        deltas = generate(request, prompt_ids, sampling, imported, keep_kv, started)
        first = await anext(deltas)  # errors surface here, before any byte is sent
        # One line per request: the caller's x-request-id (the router's) ties it to theirs.
        log.info("request %s x-request-id=%s prompt_tokens=%d first_token=%.3fms", rid,
                 request.headers.get("x-request-id", "-"), len(prompt_ids),
                 (time.monotonic() - arrived) * 1e3)

        async def all_deltas():
            yield first
            async for delta in deltas:
                yield delta

        want_logprobs = sampling.logprobs is not None
        echo = req.prompt if not chat and req.echo and isinstance(req.prompt, str) else ""

        if not req.stream:
            text, count, reason, entries = "", 0, None, []
            async for delta in all_deltas():
                text += delta.text
                reason = delta.finish_reason or reason
                count = delta.completion_tokens if delta.completion_tokens is not None else count
                entries.extend(delta.logprobs or ())
            usage = Usage.of(len(prompt_ids), count)
            if chat:
                answer = ChatCompletion(id=rid, created=created, model=served.name, usage=usage,
                                        choices=[ChatChoice(
                                            message=AssistantMessage(content=text),
                                            finish_reason=reason,
                                            logprobs=formats.chat(entries) if want_logprobs
                                            else None)])
            else:
                answer = Completion(id=rid, created=created, model=served.name, usage=usage,
                                    choices=[CompletionChoice(
                                        text=echo + text, finish_reason=reason,
                                        logprobs=formats.completion(entries, len(echo))
                                        if want_logprobs else None)])
            document = answer.model_dump()
            if keep_kv and started and started[0].id in served.engine.kept:
                document["kv_transfer_params"] = served.handoff.export(started[0]).model_dump()
            return JSONResponse(document)

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        offset = 0  # of the next token's text in the completion (log-probabilities' offsets)

        def chunk(delta: Delta | None, role: bool = False):
            nonlocal offset
            text = delta.text if delta else None
            reason = delta.finish_reason if delta else None
            entries = delta.logprobs if delta and want_logprobs else None
            if chat:
                message = ChunkDelta(role="assistant" if role else None, content=text or None)
                return ChatCompletionChunk(id=rid, created=created, model=served.name,
                                           choices=[ChatChunkChoice(
                                               delta=message, finish_reason=reason,
                                               logprobs=formats.chat(entries)
                                               if entries is not None else None)])
            logprobs = formats.completion(entries, offset) if entries is not None else None
            offset += len(text or "")
            return CompletionChunk(id=rid, created=created, model=served.name,
                                   choices=[CompletionChoice(text=text or "",
                                                             finish_reason=reason,
                                                             logprobs=logprobs)])

        async def events():
            count = 0
            try:
                if chat:
                    yield sse(chunk(Delta("", []), role=True))
                async for delta in all_deltas():
                    if delta.completion_tokens is not None:
                        count = delta.completion_tokens
                    yield sse(chunk(delta))
            except ClientDisconnect:
                return  # its sequence is aborted; nobody reads the rest
            except Exception as error:  # broken after its first byte
                log.exception("stream %s failed", rid)
                yield sse_error(ApiError(500, f"internal error: {type(error).__name__}",
                                         code="internal_error"))
            if include_usage:
                last = chunk(None)
                yield sse(last.model_copy(update={"choices": [],
                                                  "usage": Usage.of(len(prompt_ids), count)}))
            yield SSE_DONE

        return StreamingResponse(events(), media_type=SSE_MEDIA_TYPE)

    async def completions(request: Request) -> Response:
        return await respond(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await respond(request, chat=True)

    async def models(_request: Request) -> Response:
        return JSONResponse(ModelList(data=[ModelCard(
            id=served.name, created=served.created,
            max_model_len=served.max_model_len)]).model_dump())

    async def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics_route(_request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def client_disconnect(_request: Request, _error: ClientDisconnect) -> Response:
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

    async def api_error(_request: Request, error: ApiError) -> Response:
        # A 413's body was not read: the connection cannot carry another request.
        return error_response(error, close=error.status == 413)

    async def http_error(_request: Request, error: HTTPException) -> Response:
        return await api_error(_request, ApiError(
            error.status_code, f"{_request.method} {_request.url.path}: {error.detail}",
            code="not_found" if error.status_code == 404 else "method_not_allowed",
            headers=dict(error.headers or {})))

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/models", models), Route("/health", health),
              Route("/metrics", metrics_route)]
    if served.handoff is not None:
        routes.append(Route("/v1/kv/{handle}", served.handoff.exports.route, methods=["GET"]))
    app = Starlette(routes=routes,
                    exception_handlers={ApiError: api_error, HTTPException: http_error,
                                        ClientDisconnect: client_disconnect})
    return Guard(app, limits.max_body_bytes)
