"""The router's routes and serving object (`router.app`, `router.service`) in process: Starlette's
TestClient in front, upstream engines answered by httpx.MockTransport behind. Streaming is the
end-to-end tests' business (an in-process transport buffers whole responses)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from heteroserve_engines.protocol.openai import SSE_DONE, SSE_MEDIA_TYPE
from heteroserve_engines.protocol.router_config import RouterConfig
from heteroserve_engines.router.app import create_app
from heteroserve_engines.router.metrics import RouterMetrics
from heteroserve_engines.router.proxy import Relay
from heteroserve_engines.router.service import RouterService, load_api_keys
from heteroserve_engines.router.upstreams import UpstreamPool

MODEL = "org/ds-32b"  # a slash, as Hugging Face names have: /v1/models/{id} takes a path
ACC_A, ACC_B, CPU_A = "http://acc-a:8000", "http://acc-b:8000", "http://cpu-a:8000"
KEY = "sk-test-0123456789abcdef"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION_BODY = {"id": "cmpl-1", "object": "chat.completion", "model": MODEL,
                   "choices": [{"index": 0, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "hello"}}]}

# Per upstream: what its chat route answers (a status, an exception, or a Response maker).
Answer = int | Exception | Callable[[httpx.Request], httpx.Response]


class BodyStream(httpx.AsyncByteStream):
    """A body that arrives like a real transport's: httpx pre-reads `content=`/`json=` bodies,
    and the router relays with aiter_raw(), which refuses a body already read."""

    def __init__(self, *chunks: bytes | Exception):
        self.chunks = chunks

    async def __aiter__(self):
        for chunk in self.chunks:
            if isinstance(chunk, Exception):
                raise chunk
            yield chunk


def answer(status: int, body: dict | str, headers: dict[str, str] | None = None
           ) -> httpx.Response:
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    content_type = "text/plain" if isinstance(body, str) else "application/json"
    return httpx.Response(status, headers={"content-type": content_type, **(headers or {})},
                          stream=BodyStream(raw))


@dataclass
class FakeEngines:
    """Every upstream engine behind one MockTransport: /health answers 200, /metrics 404,
    /v1/models the model with the base's `contexts` entry as its max_model_len (absent: not
    reported), the completion routes what `answers` says (default 200 with COMPLETION_BODY)."""

    answers: dict[str, list[Answer]] = field(default_factory=dict)
    calls: list[tuple[str, dict]] = field(default_factory=list)
    contexts: dict[str, int] = field(default_factory=dict)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path == "/v1/models":
            card = {"id": MODEL, "object": "model"}
            if base in self.contexts:
                card["max_model_len"] = self.contexts[base]
            return httpx.Response(200, json={"object": "list", "data": [card]})
        if request.url.path == "/metrics":
            return httpx.Response(404)
        self.calls.append((base, json.loads(request.content)))
        queue = self.answers.get(base, [])
        reply = queue.pop(0) if queue else 200
        if isinstance(reply, Exception):
            raise reply
        if callable(reply):
            return reply(request)
        if reply == 200:
            return answer(200, COMPLETION_BODY)
        return answer(reply, {"error": {"message": f"engine says {reply}",
                                        "type": "server_error"}})

    def hosts(self) -> list[str]:
        return [base for base, _ in self.calls]


def config(**fields) -> RouterConfig:
    document = {"model": MODEL, "policy": "accelerator",
                "accelerator": {"urls": [ACC_A, ACC_B]},
                # Background checks never fire during a test: start() checks once.
                "health": {"intervalSeconds": 3600}, "scrapeIntervalSeconds": 3600,
                "limits": {"maxBodyBytes": 1024, "retryAfterSeconds": 7}}
    document.update(fields)
    return RouterConfig.model_validate(document)


@contextlib.contextmanager
def router(cfg: RouterConfig | None = None, engines: FakeEngines | None = None,
           api_keys: tuple[bytes, ...] = ()) -> Iterator[tuple[TestClient, RouterService,
                                                                FakeEngines]]:
    cfg = cfg or config()
    engines = engines or FakeEngines()
    client = httpx.AsyncClient(transport=httpx.MockTransport(engines))
    service = RouterService(cfg, client, UpstreamPool(cfg, client), RouterMetrics(),
                            api_keys=api_keys)
    with TestClient(create_app(service), raise_server_exceptions=True) as http:
        assert all(u.healthy for u in service.pool.upstreams.values())  # start() checked
        yield http, service, engines


def metric(service: RouterService, name: str, **labels: str) -> float:
    return service.metrics.registry.get_sample_value(name, labels) or 0.0


def assert_openai_error(response: httpx.Response, status: int, code: str | None,
                        kind: str = "invalid_request_error") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["type"]) == (code, kind)
    assert error["message"]
    return error


# -- plain routes ---------------------------------------------------------------------------------


def test_unknown_route_is_404_in_openai_shape() -> None:
    with router() as (http, _, _):
        error = assert_openai_error(http.get("/v1/embeddings"), 404, "not_found")
    assert "/v1/embeddings" in error["message"]


def test_wrong_method_is_405_in_openai_shape() -> None:
    with router() as (http, _, engines):
        response = http.get("/v1/chat/completions")
        error = assert_openai_error(response, 405, "method_not_allowed")
        assert "GET" in error["message"]
        assert response.headers["allow"] == "POST"
        assert_openai_error(http.post("/v1/models", json={}), 405, "method_not_allowed")
    assert engines.calls == []


def test_models() -> None:
    with router() as (http, service, _):
        listing = http.get("/v1/models")
        one = http.get(f"/v1/models/{MODEL}")
        other = http.get("/v1/models/org/other")
    assert listing.status_code == 200
    assert listing.json()["object"] == "list"
    assert [m["id"] for m in listing.json()["data"]] == [MODEL]
    assert one.status_code == 200
    assert one.json() == {"id": MODEL, "object": "model", "created": service.created,
                          "owned_by": "heteroserve", "max_model_len": None}
    error = assert_openai_error(other, 404, "model_not_found")
    assert error["param"] == "model" and "org/other" in error["message"]


def test_models_give_the_smallest_context_of_the_healthy_upstreams() -> None:
    """A request may go to any tier: the list promises the smallest context an upstream that
    can take it reports; an upstream out of routing does not count, and none reporting is null."""
    cfg = config(policy="auto", cpu={"urls": [CPU_A]})
    engines = FakeEngines(contexts={ACC_A: 32768, ACC_B: 16384, CPU_A: 8192})
    with router(cfg, engines) as (http, service, _):
        assert http.get("/v1/models").json()["data"][0]["max_model_len"] == 8192
        assert http.get(f"/v1/models/{MODEL}").json()["max_model_len"] == 8192
        service.pool.get(CPU_A).mark_down("refused")
        assert http.get("/v1/models").json()["data"][0]["max_model_len"] == 16384
        for url in (ACC_A, ACC_B):
            service.pool.get(url).mark_down("refused")
        assert http.get("/v1/models").json()["data"][0]["max_model_len"] is None


def test_health_ready_and_metrics_routes() -> None:
    with router() as (http, service, _):
        assert http.get("/health").json() == {"status": "ok"}
        ready = http.get("/ready")
        assert ready.status_code == 200
        assert ready.json() == {"ready": True, "healthy_upstreams": {"accelerator": 2}}
        for u in service.pool.upstreams.values():
            u.healthy = False
        assert http.get("/ready").status_code == 503
        assert "heteroserve_router_requests_in_flight" in http.get("/metrics").text


# -- request bodies -------------------------------------------------------------------------------


def test_body_over_the_limit_is_413_from_its_content_length() -> None:
    with router() as (http, _, engines):
        body = json.dumps({**CHAT, "padding": "x" * 2000}).encode()
        response = http.post("/v1/chat/completions", content=body,
                             headers={"content-type": "application/json"})
        error = assert_openai_error(response, 413, "request_too_large")
    assert "1024" in error["message"]
    assert response.headers["connection"] == "close"
    assert engines.calls == []


def test_chunked_body_over_the_limit_is_413() -> None:
    def chunks() -> Iterator[bytes]:
        yield json.dumps(CHAT)[:-1].encode()
        for _ in range(20):
            yield b' , "p": "' + b"x" * 100 + b'"'

    with router() as (http, _, engines):
        response = http.post("/v1/completions", content=chunks())
        assert "content-length" not in response.request.headers
        assert_openai_error(response, 413, "request_too_large")
    assert engines.calls == []


def test_body_at_the_limit_is_served() -> None:
    body = json.dumps({**CHAT, "padding": ""}).encode()
    body = body.replace(b'"padding": ""', b'"padding": "' + b"x" * (1024 - len(body)) + b'"')
    assert len(body) == 1024
    with router() as (http, _, _):
        assert http.post("/v1/chat/completions", content=body).status_code == 200


@pytest.mark.parametrize(("body", "param"), [
    pytest.param(b"{not json", None, id="not-json"),
    pytest.param(b"[1, 2]", None, id="not-an-object"),
    pytest.param(b"\xff\xfe", None, id="not-utf8"),
    pytest.param(json.dumps({"model": MODEL}).encode(), "messages", id="no-messages"),
    pytest.param(json.dumps({**CHAT, "temperature": 9}).encode(), "temperature",
                 id="temperature-out-of-range"),
    pytest.param(b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
                 "messages.0.content", id="lone-surrogate"),
])
def test_invalid_request_is_400(body: bytes, param: str | None) -> None:
    with router() as (http, service, engines):
        response = http.post("/v1/chat/completions", content=body)
        error = assert_openai_error(response, 400, None)
        assert error["param"] == param
        assert metric(service, "heteroserve_router_requests_total", tier="none",
                      reason="invalid_request", outcome="refused") == 1
    assert engines.calls == []


def test_another_model_is_404_model_not_found() -> None:
    with router() as (http, _, engines):
        response = http.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4o"})
        error = assert_openai_error(response, 404, "model_not_found")
    assert error["param"] == "model" and "gpt-4o" in error["message"]
    assert engines.calls == []


# -- API keys -------------------------------------------------------------------------------------


def test_load_api_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# the router's keys\n\n  {KEY}  \nsk-second\n")
    assert load_api_keys(path) == (KEY.encode(), b"sk-second")


@pytest.mark.parametrize("text", [pytest.param("", id="empty"),
                                  pytest.param("# only a comment\n\n   \n", id="comments")])
def test_load_api_keys_refuses_a_file_without_keys(tmp_path: Path, text: str) -> None:
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(ValueError, match="holds no key"):
        load_api_keys(path)


def test_load_api_keys_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read the API key file"):
        load_api_keys(tmp_path / "absent")


@pytest.mark.parametrize("header", [
    pytest.param(None, id="no-header"),
    pytest.param("Bearer sk-wrong", id="wrong-key"),
    pytest.param(f"Bearer {KEY}x", id="key-with-suffix"),
    pytest.param(f"Basic {KEY}", id="wrong-scheme"),
    pytest.param("Bearer ", id="empty-key"),
])
def test_api_key_refused(header: str | None) -> None:
    headers = {"authorization": header} if header else {}
    with router(api_keys=(KEY.encode(), b"sk-other")) as (http, _, engines):
        for response in (http.get("/v1/models", headers=headers),
                         http.get(f"/v1/models/{MODEL}", headers=headers),
                         http.post("/v1/chat/completions", json=CHAT, headers=headers)):
            error = assert_openai_error(response, 401, "invalid_api_key",
                                        "authentication_error")
            assert KEY not in error["message"]
        assert http.get("/health").status_code == 200  # probes need no key
        assert http.get("/ready").status_code == 200
    assert engines.calls == []


@pytest.mark.parametrize("header", [pytest.param(f"Bearer {KEY}", id="first-key"),
                                    pytest.param("bearer sk-other", id="second-key-lowercase")])
def test_api_key_accepted(header: str) -> None:
    with router(api_keys=(KEY.encode(), b"sk-other")) as (http, _, engines):
        assert http.get("/v1/models", headers={"authorization": header}).status_code == 200
        response = http.post("/v1/chat/completions", json=CHAT,
                             headers={"authorization": header})
        assert response.status_code == 200
        assert response.json() == COMPLETION_BODY
    assert len(engines.calls) == 1


def test_api_key_never_logged(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with router(api_keys=(KEY.encode(),)) as (http, _, _):
        http.post("/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {KEY}"})
        http.post("/v1/chat/completions", json=CHAT,
                  headers={"authorization": f"Bearer {KEY}-wrong"})
        http.post("/v1/chat/completions", json={**CHAT, "model": "x"},
                  headers={"authorization": f"Bearer {KEY}"})
    assert any("request " in r.getMessage() for r in caplog.records)  # something was logged
    assert KEY not in caplog.text


def test_api_key_not_forwarded_to_the_engine() -> None:
    seen: list[httpx.Headers] = []

    def capture(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return answer(200, COMPLETION_BODY)

    engines = FakeEngines({ACC_A: [capture]})
    with router(engines=engines, api_keys=(KEY.encode(),)) as (http, _, _):
        http.post("/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {KEY}"})
    assert "authorization" not in seen[0]


# -- admission ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "code"), [pytest.param("accelerator", "accelerator_full"),
                                              pytest.param("auto", "all_full")])
def test_every_upstream_at_max_concurrency_is_429_with_retry_after(policy: str,
                                                                   code: str) -> None:
    cfg = config(policy=policy, accelerator={"urls": [ACC_A, ACC_B], "maxConcurrency": 2})
    with router(cfg) as (http, service, engines):
        for u in service.pool.upstreams.values():
            u.in_flight = 2
        response = http.post("/v1/chat/completions", json=CHAT)
        assert_openai_error(response, 429, code, "rate_limit_error")
        assert response.headers["retry-after"] == "7"
        assert metric(service, "heteroserve_router_refused_total", status="429", code=code) == 1
        service.pool.get(ACC_B).in_flight = 1
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert engines.hosts() == [ACC_B]


def test_no_healthy_upstream_is_503_with_retry_after() -> None:
    with router() as (http, service, engines):
        for u in service.pool.upstreams.values():
            u.healthy = False
        response = http.post("/v1/chat/completions", json=CHAT)
        assert_openai_error(response, 503, "accelerator_unavailable", "server_error")
        assert response.headers["retry-after"] == "7"
    assert engines.calls == []


def test_policy_split_is_501() -> None:
    cfg = config(policy="split", cpu={"urls": [CPU_A]})
    with router(cfg) as (http, service, engines):
        response = http.post("/v1/chat/completions", json=CHAT)
        error = assert_openai_error(response, 501, "split_unavailable", "server_error")
        assert "retry-after" not in response.headers
        assert metric(service, "heteroserve_router_decisions_total", policy="split",
                      tier="none", mode="whole", reason="split_unavailable") == 1
    assert "KV hand-off" in error["message"]
    assert engines.calls == []


@pytest.mark.parametrize(("advertised", "pulled_from"), [
    ("10.1.2.3", "10.1.2.3"),  # the engine's pod IP (--kv-advertise-host)
    (None, "acc-a"),  # no advertised address: the one the router reached the engine at
])
def test_split_passes_the_prefill_engines_address_to_the_decode(advertised, pulled_from) -> None:
    """A router sidecar reaches its prefill engine on loopback; a decode engine in another pod
    must pull from the engine's own address, so the router keeps the one the engine gives."""
    params = {"do_remote_prefill": True, "remote_engine_id": "e1", "remote_handle": "h" * 24,
              "remote_host": advertised, "remote_port": 8001}

    def prefill(request: httpx.Request) -> httpx.Response:
        return answer(200, {**COMPLETION_BODY, "kv_transfer_params": params})

    cfg = config(policy="split", accelerator={"urls": [ACC_A], "kvExport": True},
                 cpu={"urls": [CPU_A], "kvImport": True})
    engines = FakeEngines(answers={ACC_A: [prefill]})
    with router(cfg, engines) as (http, _, _):
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
    decode = [payload for base, payload in engines.calls if base == CPU_A]
    assert decode[0]["kv_transfer_params"]["remote_host"] == pulled_from
    assert decode[0]["kv_transfer_params"]["remote_port"] == 8001


def test_draining_router_refuses_with_503() -> None:
    with router() as (http, service, engines):
        service.draining = True
        response = http.post("/v1/chat/completions", json=CHAT)
        assert_openai_error(response, 503, "shutting_down", "server_error")
        assert http.get("/ready").status_code == 503
    assert engines.calls == []


# -- proxying and retries -------------------------------------------------------------------------


def test_served_request_goes_to_the_least_loaded_upstream_and_is_tagged() -> None:
    with router() as (http, service, engines):
        service.pool.get(ACC_A).in_flight = 3
        response = http.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
        assert response.status_code == 200
        assert response.headers["x-heteroserve-tier"] == "accelerator"
        assert response.headers["x-heteroserve-reason"] == "policy_accelerator"
        assert len(response.headers["x-request-id"]) == 16
        assert service.pool.get(ACC_B).in_flight == 0  # released when the relay ended
        assert metric(service, "heteroserve_router_requests_total", tier="accelerator",
                      reason="policy_accelerator", outcome="success") == 1
    assert engines.hosts() == [ACC_B]


def test_the_routers_own_time_is_measured_and_logged(caplog) -> None:
    """heteroserve_router_overhead_seconds and the log line's overhead: the router's share
    of the time to the first byte, a small positive number for every relayed request."""
    caplog.set_level(logging.INFO, logger="heteroserve.router")
    with router() as (http, service, _):
        for _ in range(3):
            assert http.post("/v1/completions", json={"model": MODEL, "prompt": "hi"}
                             ).status_code == 200
        count = metric(service, "heteroserve_router_overhead_seconds_count", tier="accelerator")
        total = metric(service, "heteroserve_router_overhead_seconds_sum", tier="accelerator")
    assert count == 3 and 0 < total < 3 * 0.5
    logged = [float(m) for m in re.findall(r"overhead=([0-9.]+)ms", caplog.text)]
    assert len(logged) == 3 and all(0 < value < 500 for value in logged)


def test_served_model_name_is_rewritten() -> None:
    cfg = config(accelerator={"urls": [ACC_A], "servedModelName": "/models/ds-32b"})
    with router(cfg) as (http, _, engines):
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
    ((_, sent),) = engines.calls
    assert sent["model"] == "/models/ds-32b"
    assert sent["messages"] == CHAT["messages"] and sent["max_tokens"] == 4


def test_upstream_500_is_retried_on_another_upstream() -> None:
    engines = FakeEngines({ACC_A: [500]})
    with router(engines=engines) as (http, service, _):
        response = http.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200
        assert response.json() == COMPLETION_BODY
        assert metric(service, "heteroserve_router_retries_total", tier="accelerator") == 1
        assert metric(service, "heteroserve_router_upstream_errors_total", tier="accelerator",
                      kind="http_500") == 1
        assert service.pool.get(ACC_A).healthy  # a 5xx answer is no reason to remove it
        assert all(u.in_flight == 0 for u in service.pool.upstreams.values())
    assert engines.hosts() == [ACC_A, ACC_B]


def test_connect_error_marks_the_upstream_down_and_is_retried() -> None:
    refused = httpx.ConnectError("connection refused")
    engines = FakeEngines({ACC_A: [refused]})
    with router(engines=engines) as (http, service, _):
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert not service.pool.get(ACC_A).healthy
        assert metric(service, "heteroserve_router_upstream_errors_total", tier="accelerator",
                      kind="connect") == 1
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert engines.hosts() == [ACC_A, ACC_B, ACC_B]


def test_retries_exhausted_passes_on_the_last_engine_error() -> None:
    engines = FakeEngines({ACC_A: [503], ACC_B: [500]})
    with router(engines=engines) as (http, service, _):
        response = http.post("/v1/chat/completions", json=CHAT)
        error = assert_openai_error(response, 500, None, "server_error")
        assert error["message"] == "engine says 500"
        assert metric(service, "heteroserve_router_requests_total", tier="accelerator",
                      reason="policy_accelerator", outcome="upstream_error") == 1
    assert engines.hosts() == [ACC_A, ACC_B]


def test_retries_zero_tries_one_upstream() -> None:
    engines = FakeEngines({ACC_A: [500]})
    with router(config(retries=0), engines) as (http, service, _):
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 500
        assert metric(service, "heteroserve_router_retries_total", tier="accelerator") == 0
    assert engines.hosts() == [ACC_A]


def test_client_error_from_the_engine_is_not_retried() -> None:
    engines = FakeEngines({ACC_A: [400]})
    with router(engines=engines) as (http, _, _):
        response = http.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 400
        assert response.json()["error"]["message"] == "engine says 400"
    assert engines.hosts() == [ACC_A]


def test_engine_error_without_openai_body_becomes_502() -> None:
    engines = FakeEngines({ACC_A: [lambda r: answer(500, "Internal Server Error")]})
    with router(config(retries=0), engines) as (http, _, _):
        response = http.post("/v1/chat/completions", json=CHAT)
        error = assert_openai_error(response, 502, "upstream_error", "server_error")
    assert "HTTP 500: Internal Server Error" in error["message"]


def test_auto_offload_falls_back_to_the_accelerator() -> None:
    """An offloaded request whose CPU engine fails before the first byte is retried on the
    accelerator (the decision's fallbacks), and counted as a fallback."""
    cfg = config(policy="auto", accelerator={"urls": [ACC_A]}, cpu={"urls": [CPU_A]})
    engines = FakeEngines({CPU_A: [502]})
    with router(cfg, engines) as (http, service, _):
        service.pool.get(ACC_A).kv_usage = 0.97
        response = http.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200
        assert response.headers["x-heteroserve-tier"] == "accelerator"
        assert response.headers["x-heteroserve-reason"] == "accelerator_kv_pressure"
        assert metric(service, "heteroserve_router_offloads_total",
                      reason="accelerator_kv_pressure") == 1
        assert metric(service, "heteroserve_router_fallbacks_total", from_tier="cpu",
                      to_tier="accelerator") == 1
        assert metric(service, "heteroserve_router_offloading") == 1
    assert engines.hosts() == [CPU_A, ACC_A]


def test_compressed_engine_answer_reaches_the_client_readable() -> None:
    """The relay passes bytes through untouched (aiter_raw): an engine that compresses when
    asked (as httpx asks by default) must not be asked, or the client gets unreadable bytes."""
    plain = json.dumps(COMPLETION_BODY).encode()

    def compressed(request: httpx.Request) -> httpx.Response:
        if "gzip" in request.headers.get("accept-encoding", ""):
            return httpx.Response(200, headers={"content-type": "application/json",
                                                "content-encoding": "gzip"},
                                  stream=BodyStream(gzip.compress(plain)))
        return httpx.Response(200, headers={"content-type": "application/json"},
                              stream=BodyStream(plain))

    engines = FakeEngines({ACC_A: [compressed]})
    with router(config(retries=0), engines) as (http, _, _):
        response = http.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.json() == COMPLETION_BODY


# -- the relay ------------------------------------------------------------------------------------


def test_relay_ends_when_the_engine_body_fails_with_a_non_httpx_error() -> None:
    """proxy.py promises "never a hung connection": a body that fails with something other than
    an httpx.HTTPError must still end the stream with an error event and release the upstream
    (on_end), not leave the client waiting on the queue."""
    ended: list[Relay] = []
    chunks: list[bytes] = []

    async def scenario() -> None:
        response = httpx.Response(200, headers={"content-type": SSE_MEDIA_TYPE},
                                  stream=BodyStream(b"data: {}\n\n", RuntimeError("decoder")))
        relay = Relay(response, event_stream=True, on_chunk=lambda _now: None,
                      on_end=ended.append)

        async def consume() -> None:
            async for chunk in relay:
                chunks.append(chunk)

        with contextlib.suppress(TimeoutError, RuntimeError):
            await asyncio.wait_for(consume(), 0.5)

    asyncio.run(scenario())
    assert chunks[0] == b"data: {}\n\n"
    assert chunks[-1] == SSE_DONE
    assert len(ended) == 1 and ended[0].outcome == "upstream_error"


class Hanging(httpx.AsyncByteStream):
    """A body whose chunks all arrive but whose end never does (the engine's EOF still on its
    way when the client leaves)."""

    def __init__(self, *chunks: bytes):
        self.chunks = chunks

    async def __aiter__(self):
        for chunk in self.chunks:
            yield chunk
        await asyncio.sleep(3600)


@pytest.mark.parametrize(("event_stream", "chunks", "read", "outcome"), [
    (True, (b"data: {}\n\n", SSE_DONE), 2, "success"),  # left after [DONE]
    (True, (b"data: {}\n\n", SSE_DONE), 1, "client_disconnect"),  # left before it
    (False, (b'{"a": 1', b"}"), 2, "success"),  # left with the whole Content-Length
    (False, (b'{"a": 1', b"}"), 1, "client_disconnect"),
])
def test_relay_outcome_when_the_client_leaves_before_the_upstream_ends(
        event_stream, chunks, read, outcome) -> None:
    """Seen in CI: a streamed chat read to [DONE] by the openai client was counted as a client
    disconnect, because the client closed before the engine's end of body reached the router."""
    ended: list[Relay] = []

    async def scenario() -> None:
        headers = {"content-type": SSE_MEDIA_TYPE} if event_stream else {
            "content-type": "application/json",
            "content-length": str(sum(len(c) for c in chunks))}
        relay = Relay(httpx.Response(200, headers=headers, stream=Hanging(*chunks)),
                      event_stream=event_stream, on_chunk=lambda _now: None,
                      on_end=ended.append)
        body = relay.__aiter__()
        for _ in range(read):
            await body.__anext__()
        task = asyncio.ensure_future(body.__anext__())  # the server asks for more ...
        await asyncio.sleep(0.05)
        task.cancel()  # ... and the client leaves
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await task

    asyncio.run(asyncio.wait_for(scenario(), 5))
    assert len(ended) == 1 and ended[0].outcome == outcome


def test_relay_broken_stream_delivers_what_came_before_the_error_event() -> None:
    """Chunks the engine sent before its stream broke are the client's (tokens it generated):
    they must not be dropped because the pump saw the break before the client drained the
    queue."""
    ended: list[Relay] = []

    async def scenario() -> list[bytes]:
        response = httpx.Response(200, stream=BodyStream(
            b"data: {}\n\n", httpx.RemoteProtocolError("peer closed connection")))
        relay = Relay(response, event_stream=True, on_chunk=lambda _now: None,
                      on_end=ended.append)
        return [chunk async for chunk in relay]

    chunks = asyncio.run(asyncio.wait_for(scenario(), 0.5))
    assert chunks[0] == b"data: {}\n\n" and chunks[-1] == SSE_DONE
    assert b"upstream_stream_error" in chunks[-2]
    assert ended[0].outcome == "upstream_error"
