"""The router's serving object: parse -> decide -> proxy, with admission, retries before the
first byte, metrics and one log line per request. The routes in `app` only call into it."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
from pydantic import ValidationError
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..protocol.openai import (
    SSE_MEDIA_TYPE,
    ApiError,
    ChatRequest,
    CompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    parse_body,
)
from ..protocol.router_config import TIERS, RouterConfig
from .metrics import RouterMetrics
from .policy import Decision, OffloadState, RequestInfo, decide
from .proxy import Relay
from .upstreams import Upstream, UpstreamPool

log = logging.getLogger("heteroserve.router")

ROUTES = {"chat": "/chat/completions", "completion": "/completions"}
# Upstream error bodies are read whole (they are small) to pass on their message.
ERROR_BODY_LIMIT = 64 * 1024


class ClientGone(Exception):
    """The client disconnected while the router waited for an upstream."""


def load_api_keys(path: str | Path) -> tuple[bytes, ...]:
    """One key per line; blank lines and # comments ignored. The keys are never logged."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise ValueError(f"cannot read the API key file {path}: {error.strerror}") from None
    keys = tuple(line.strip().encode() for line in lines
                 if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise ValueError(f"the API key file {path} holds no key")
    return keys


@dataclass
class Attempt:
    """One request's bookkeeping, from arrival to its last byte."""

    id: str
    kind: str
    arrival: float
    decision: Decision | None = None
    tier: str = "none"
    upstream: str = ""
    status: int = 0
    first_chunk: float | None = None
    last_chunk: float | None = None
    first_sent: float | None = None  # the first upstream request's send
    overhead: float | None = None  # the router's own share of the TTFT (_relay_ended)
    tiers_tried: list[str] = field(default_factory=list)


class RouterService:
    def __init__(self, config: RouterConfig, client: httpx.AsyncClient, pool: UpstreamPool,
                 metrics: RouterMetrics, api_keys: tuple[bytes, ...] = (),
                 clock: Callable[[], float] = time.monotonic):
        self.config, self.client, self.pool, self.metrics = config, client, pool, metrics
        self.api_keys, self.clock = api_keys, clock
        self.offload_state = OffloadState()
        self.created = int(time.time())
        self.relays: set[Relay] = set()
        self.draining = False
        # Parsed upstream URLs: httpx.URL() from a string was a tenth of the router's CPU per
        # request (py-spy, canned upstream). Bounded: DNS discovery may bring new addresses.
        self._urls: dict[str, httpx.URL] = {}
        connect = config.connect_timeout_seconds
        self._timeouts = {
            stream: httpx.Timeout(config.idle_timeout_seconds if stream
                                  else config.request_timeout_seconds, connect=connect).as_dict()
            for stream in (False, True)}

    # -- plain answers ---------------------------------------------------------------------------
    def models(self) -> ModelList:
        # The context a request can count on wherever it is routed: the smallest that a
        # healthy upstream reports (None while none reports one).
        lengths = [u.max_model_len for u in self.pool.upstreams.values()
                   if u.healthy and u.max_model_len is not None]
        return ModelList(data=[ModelCard(id=self.config.model, created=self.created,
                                         max_model_len=min(lengths, default=None))])

    def model(self, model_id: str) -> ModelCard:
        if model_id != self.config.model:
            raise ApiError(404, f"The model `{model_id}` does not exist.", param="model",
                           code="model_not_found")
        return self.models().data[0]

    def required_tiers(self) -> tuple[str, ...]:
        """Tiers that must have a healthy upstream for /ready. auto serves from either tier, so
        one healthy tier is enough for it."""
        return {"accelerator": ("accelerator",), "cpu": ("cpu",),
                "split": ("accelerator", "cpu")}.get(self.config.policy, ())

    def readiness(self) -> tuple[bool, dict[str, int]]:
        healthy = {tier: sum(u.healthy for u in self.pool.tier(tier)) for tier in TIERS
                   if self.config.tier(tier)}
        required = self.required_tiers()
        ok = (all(healthy.get(t, 0) for t in required) if required
              else any(healthy.values())) and not self.draining
        return ok, healthy

    def authorize(self, header: str | None) -> None:
        if not self.api_keys:
            return
        scheme, _, token = (header or "").partition(" ")
        given = token.strip().encode() if scheme.lower() == "bearer" else b""
        # Every key is compared (constant time each), so timing says nothing about which.
        matched = False
        for key in self.api_keys:
            matched |= hmac.compare_digest(given, key)
        if not matched:
            raise ApiError(401, "Incorrect or missing API key: send `Authorization: Bearer "
                           "<key>`.", code="invalid_api_key")

    # -- shutdown --------------------------------------------------------------------------------
    def begin_drain(self) -> None:
        """SIGTERM: refuse new requests; after `drainSeconds` end what is still relayed."""
        if self.draining:
            return
        self.draining = True
        log.info("draining: %d request(s) in flight, %.0f s grace", len(self.relays),
                 self.config.drain_seconds)
        asyncio.get_running_loop().call_later(self.config.drain_seconds, self.end_relays)

    def end_relays(self) -> None:
        for relay in list(self.relays):
            relay.abort(ApiError(503, "the router is shutting down; the response was cut",
                                 code="shutting_down"))

    # -- completions -----------------------------------------------------------------------------
    async def complete(self, kind: str, body: bytes,
                       disconnected: Callable[[], Awaitable[None]]) -> Response:
        attempt = Attempt(uuid.uuid4().hex[:16], kind, self.clock())
        try:
            return await self._complete(attempt, body, disconnected)
        except ApiError as error:
            self._finish(attempt, "upstream_error" if attempt.tiers_tried else "refused",
                         error.status)
            self.metrics.refused.labels(str(error.status), error.code or "").inc()
            raise
        except ClientGone:
            self._finish(attempt, "client_disconnect", 499)
            return Response(status_code=499)

    async def _complete(self, attempt: Attempt, body: bytes,
                        disconnected: Callable[[], Awaitable[None]]) -> Response:
        if self.draining:
            raise ApiError(503, "the router is shutting down; retry on another replica",
                           code="shutting_down", headers={"Retry-After": "1"})
        payload = parse_body(body)
        request_type = ChatRequest if attempt.kind == "chat" else CompletionRequest
        try:
            request = request_type.model_validate(payload)
        except ValidationError as error:
            first = error.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            raise ApiError(400, f"{param}: {first['msg']}", param=param) from None
        if request.model != self.config.model:
            raise ApiError(404, f"The model `{request.model}` does not exist.", param="model",
                           code="model_not_found")
        info = RequestInfo(attempt.kind, request.stream, request.completion_limit)
        decision, self.offload_state = decide(
            self.config.policy, info, self.pool.snapshot(), self.config.offload,
            self.offload_state, self.clock(), kv_handoff=self.config.kv_handoff)
        attempt.decision = decision
        self.metrics.offloading.set(1 if self.offload_state.offloading else 0)
        self.metrics.decisions.labels(self.config.policy, decision.tier or "none", decision.mode,
                                      decision.reason).inc()
        if decision.tier is None:
            headers = ({"Retry-After": str(self.config.limits.retry_after_seconds)}
                       if decision.status in (429, 503) else None)
            raise ApiError(decision.status, decision.message, code=decision.reason,
                           headers=headers)
        if decision.offload:
            self.metrics.offloads.labels(decision.reason).inc()
        if decision.mode == "split":
            return await self._split(attempt, payload, request.stream, decision, disconnected)
        return await self._proxy(attempt, payload, request.stream, decision, disconnected)

    async def _split(self, attempt: Attempt, payload: dict, stream: bool, decision: Decision,
                     disconnected: Callable[[], Awaitable[None]]) -> Response:
        """Prefill on the accelerator (one token, its KV kept under a handle), then the decode
        on a CPU engine that pulls that KV (vLLM's disaggregated-serving exchange: the prefill
        answers `kv_transfer_params`, passed on to the decode). A prefill that fails or returns
        no handle, or a decode engine that refuses the KV, falls back to the CPU computing the
        prompt itself; each outcome is counted."""
        params = await self._prefill(attempt, payload, decision, disconnected)
        whole = replace(decision, mode="whole", fallbacks=())
        if params is None:
            self.metrics.kv_handoffs.labels("prefill_failed").inc()
            return await self._proxy(attempt, payload, stream, whole, disconnected)
        decode_payload = {**payload, "kv_transfer_params": params}
        for candidate in decision.candidates:
            upstream = self.pool.get(candidate.url)
            if upstream is None:
                continue
            outcome = await self._try(attempt, upstream, decode_payload, stream, disconnected,
                                      last=False, refusals_retry=True)
            if isinstance(outcome, Response):
                self.metrics.kv_handoffs.labels("ok").inc()
                return outcome
            self.metrics.kv_handoffs.labels("decode_refused").inc()
            log.warning("request %s: %s refused the KV hand-off (%s): the CPU computes the "
                        "prompt", attempt.id, upstream.url, outcome.code)
            break
        return await self._proxy(attempt, payload, stream, whole, disconnected)

    async def _prefill(self, attempt: Attempt, payload: dict, decision: Decision,
                       disconnected: Callable[[], Awaitable[None]]) -> dict | None:
        """The split's first half: the kv_transfer_params the decode engine needs, or None."""
        body = {k: v for k, v in payload.items() if k not in ("stream", "stream_options",
                                                                "max_completion_tokens")}
        body.update(max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
        for candidate in decision.prefill[: self.config.retries + 1]:
            upstream = self.pool.get(candidate.url)
            if upstream is None:
                continue
            upstream.in_flight += 1
            self.metrics.in_flight.labels(upstream.tier).inc()
            try:
                request = self._upstream_request(upstream, body, False, attempt)
                response = await _race(self.client.send(request), disconnected)
                answer = response.json() if response.status_code == 200 else {}
            except (httpx.HTTPError, ValueError) as error:
                if isinstance(error, httpx.ConnectError):
                    upstream.mark_down(str(error))
                self.metrics.upstream_errors.labels(upstream.tier, "prefill").inc()
                continue
            finally:
                upstream.in_flight -= 1
                self.metrics.in_flight.labels(upstream.tier).dec()
            params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
            if isinstance(params, dict) and params.get("remote_handle"):
                # The engine knows its port, not the address the router reached it at.
                parts = httpx.URL(upstream.url)
                params.setdefault("remote_host", None)
                params["remote_host"] = params["remote_host"] or parts.host
                params["remote_port"] = params.get("remote_port") or parts.port
                return params
            self.metrics.upstream_errors.labels(upstream.tier, "prefill").inc()
        return None

    async def _proxy(self, attempt: Attempt, payload: dict, stream: bool, decision: Decision,
                     disconnected: Callable[[], Awaitable[None]]) -> Response:
        candidates = [*decision.candidates, *decision.fallbacks][: self.config.retries + 1]
        last_error: ApiError | None = None
        for index, candidate in enumerate(candidates):
            upstream = self.pool.get(candidate.url)
            if upstream is None:
                continue
            if index:
                self.metrics.retries.labels(upstream.tier).inc()
            outcome = await self._try(attempt, upstream, payload, stream, disconnected,
                                      last=index == len(candidates) - 1)
            if isinstance(outcome, Response):
                if upstream.tier != decision.tier:
                    self.metrics.fallbacks.labels(decision.tier, upstream.tier).inc()
                return outcome
            last_error = outcome
        raise last_error or ApiError(503, "no upstream could take the request; retry later",
                                     code="no_upstream", headers={"Retry-After": str(
                                         self.config.limits.retry_after_seconds)})

    def _upstream_request(self, upstream: Upstream, payload: dict, stream: bool,
                          attempt: Attempt) -> httpx.Request:
        served = upstream.config.served_model_name
        body = json.dumps({**payload, "model": served} if served else payload).encode()
        address = upstream.url + upstream.config.api_prefix + ROUTES[attempt.kind]
        url = self._urls.get(address)
        if url is None:
            if len(self._urls) >= 1024:
                self._urls.clear()
            url = self._urls[address] = httpx.URL(address)
        # A plain Request, not client.build_request(): the client's defaults (its headers,
        # cookies, base URL) mean nothing to an upstream, and merging them cost as much again.
        return httpx.Request(
            "POST", url, content=body, extensions={"timeout": self._timeouts[stream]},
            # identity: the relay passes bytes through unchanged, so they must be plain.
            headers={"content-type": "application/json", "accept-encoding": "identity",
                     "x-request-id": attempt.id})

    async def _try(self, attempt: Attempt, upstream: Upstream, payload: dict, stream: bool,
                   disconnected: Callable[[], Awaitable[None]], last: bool,
                   refusals_retry: bool = False) -> Response | ApiError:
        """One upstream: a Response once its headers are in (the relay then owns it), else the
        error to answer if no other upstream succeeds. `refusals_retry`: a 4xx is returned as
        an error too (the split's decode: a refused KV falls back)."""
        attempt.tier, attempt.upstream = upstream.tier, upstream.url
        attempt.tiers_tried.append(upstream.tier)
        tier = upstream.tier
        upstream.in_flight += 1
        self.metrics.in_flight.labels(tier).inc()
        relayed = False
        try:
            request = self._upstream_request(upstream, payload, stream, attempt)
            if attempt.first_sent is None:
                attempt.first_sent = self.clock()
            try:
                response = await _race(self.client.send(request, stream=True), disconnected)
            except (httpx.ConnectError, httpx.ConnectTimeout) as error:
                upstream.mark_down(f"{type(error).__name__}: {error}")
                self.metrics.upstream_errors.labels(tier, "connect").inc()
                return ApiError(502, f"the {tier} engine is unreachable", code="upstream_error")
            except httpx.TimeoutException:
                self.metrics.upstream_errors.labels(tier, "timeout").inc()
                return ApiError(504, f"the {tier} engine did not answer in time",
                                code="upstream_timeout")
            except httpx.HTTPError as error:
                self.metrics.upstream_errors.labels(tier, "protocol").inc()
                return ApiError(502, f"the {tier} engine failed before answering "
                                f"({type(error).__name__})", code="upstream_error")
            attempt.status = response.status_code
            if response.status_code >= 400:
                error = await _upstream_error(response, tier)
                self.metrics.upstream_errors.labels(tier, f"http_{response.status_code}").inc()
                retryable = (response.status_code >= 500 or response.status_code == 429
                             or refusals_retry)
                if retryable and not last:
                    return error
                self._finish(attempt, "upstream_error" if retryable else "upstream_refused",
                             response.status_code)
                return _error_response(error)
            relay = Relay(response, event_stream=stream, on_chunk=self._chunk_timer(attempt),
                          on_end=lambda r: self._relay_ended(r, attempt, upstream))
            self.relays.add(relay)
            relayed = True
            return StreamingResponse(
                relay, status_code=response.status_code,
                media_type=response.headers.get("content-type", SSE_MEDIA_TYPE if stream
                                                 else "application/json"),
                headers={"x-request-id": attempt.id, "x-heteroserve-tier": tier,
                         "x-heteroserve-reason": attempt.decision.reason})
        finally:
            if not relayed:
                upstream.in_flight -= 1
                self.metrics.in_flight.labels(tier).dec()

    def _chunk_timer(self, attempt: Attempt) -> Callable[[float], None]:
        ttft, itl = (self.metrics.ttft.labels(attempt.tier),
                     self.metrics.inter_token.labels(attempt.tier))

        def on_chunk(now: float) -> None:
            if attempt.first_chunk is None:
                attempt.first_chunk = now
                ttft.observe(now - attempt.arrival)
            else:
                itl.observe(now - attempt.last_chunk)
            attempt.last_chunk = now
        return on_chunk

    def _relay_ended(self, relay: Relay, attempt: Attempt, upstream: Upstream) -> None:
        self.relays.discard(relay)
        upstream.in_flight -= 1
        self.metrics.in_flight.labels(upstream.tier).dec()
        if relay.outcome == "upstream_error":
            self.metrics.upstream_errors.labels(upstream.tier, "stream").inc()
            log.warning("request %s: %s stream from %s broke: %s", attempt.id, upstream.tier,
                        upstream.url, relay.error_detail)
        self.metrics.e2e.labels(upstream.tier).observe(self.clock() - attempt.arrival)
        if attempt.first_sent is not None and attempt.first_chunk is not None \
                and relay.first_received is not None:
            # The router's own share of the time to the first byte: before its first upstream
            # request, and between the upstream's first bytes and their relay.
            attempt.overhead = (attempt.first_sent - attempt.arrival
                                + attempt.first_chunk - relay.first_received)
            self.metrics.overhead.labels(upstream.tier).observe(attempt.overhead)
        self._finish(attempt, relay.outcome, attempt.status)

    def _finish(self, attempt: Attempt, outcome: str, status: int) -> None:
        decision = attempt.decision
        reason = decision.reason if decision else "invalid_request"
        self.metrics.requests.labels(attempt.tier, reason, outcome).inc()
        ttft = (f"{attempt.first_chunk - attempt.arrival:.3f}s" if attempt.first_chunk
                else "-")
        overhead = f"{attempt.overhead * 1e3:.3f}ms" if attempt.overhead is not None else "-"
        log.info("request %s %s policy=%s tier=%s reason=%s mode=%s tried=%s status=%d "
                 "outcome=%s ttft=%s e2e=%.3fs overhead=%s", attempt.id, attempt.kind,
                 self.config.policy, attempt.tier, reason, decision.mode if decision else "-",
                 ",".join(attempt.tiers_tried) or "-", status, outcome, ttft,
                 self.clock() - attempt.arrival, overhead)


async def _race(work: Awaitable[httpx.Response], disconnected: Callable[[], Awaitable[None]]
                ) -> httpx.Response:
    """`work`, unless the client disconnects first (then ClientGone; the upstream request is
    cancelled, which closes its connection: the engine frees the sequence)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watch.cancel()
        raise
    if task in done:
        watch.cancel()
        return task.result()
    task.cancel()
    raise ClientGone


async def _upstream_error(response: httpx.Response, tier: str) -> ApiError:
    """An upstream's error answer in OpenAI's shape: its own message when it sent one."""
    status = response.status_code
    try:
        raw = b""
        async for chunk in response.aiter_raw():
            raw += chunk
            if len(raw) > ERROR_BODY_LIMIT:
                break
    except httpx.HTTPError:
        raw = b""
    finally:
        await response.aclose()
    try:
        error = ErrorResponse.model_validate_json(raw).error
        headers = {"Retry-After": response.headers["retry-after"]} \
            if "retry-after" in response.headers else None
        return ApiError(status, error.message, param=error.param, code=error.code,
                        kind=error.type, headers=headers)
    except ValidationError:
        text = raw.decode(errors="replace").strip()[:200]
        return ApiError(502 if status >= 500 else status,
                        f"the {tier} engine answered HTTP {status}: {text}",
                        code="upstream_error")


def _error_response(error: ApiError) -> Response:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

