"""The router's upstreams (`router.upstreams`): metrics parsing, health bookkeeping, load
bookkeeping and DNS discovery. HTTP goes through httpx.MockTransport; DNS through an injected
resolver: no sockets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx
import pytest

from heteroserve_engines.protocol.router_config import RouterConfig, TierConfig
from heteroserve_engines.router.upstreams import (
    Upstream,
    UpstreamPool,
    context_length,
    read_load,
)

# A vLLM 0.8-style exposition (prometheus_client's text format): the old KV-usage name, counters
# with their _total and _created lines, histograms, and the model_name label on everything.
VLLM_V0 = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="ds-32b"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="ds-32b"} 2.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="ds-32b"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="ds-32b"} 0.875
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="ds-32b"} 7.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{model_name="ds-32b"} 1.7212345678e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="ds-32b"} 123456.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{model_name="ds-32b"} 1.7212345678e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="ds-32b"} 4.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="ds-32b"} 9.0
vllm:time_to_first_token_seconds_count{model_name="ds-32b"} 9.0
vllm:time_to_first_token_seconds_sum{model_name="ds-32b"} 2.5
"""

# vLLM 0.10+: kv_cache_usage_perc, the family declared without _total, one series per engine.
VLLM_V1 = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="ds-32b"} 2.0
vllm:num_requests_running{engine="1",model_name="ds-32b"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="ds-32b"} 0.0
vllm:num_requests_waiting{engine="1",model_name="ds-32b"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="ds-32b"} 0.25
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="ds-32b"} 1.0
vllm:num_preemptions_created{engine="0",model_name="ds-32b"} 1.7e+09
vllm:num_preemptions_total{engine="1",model_name="ds-32b"} 2.0
vllm:num_preemptions_created{engine="1",model_name="ds-32b"} 1.7e+09
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="ds-32b"} 10.0
vllm:generation_tokens_total{engine="1",model_name="ds-32b"} 5.0
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
"""


def tier(**fields) -> TierConfig:
    return TierConfig(urls=fields.pop("urls", ["http://engine:8000"]), **fields)


def upstream(url: str = "http://engine:8000", tier_name: str = "cpu", **fields) -> Upstream:
    return Upstream(url, tier_name, tier(urls=[url], **fields))


# -- read_load ------------------------------------------------------------------------------------


def test_read_load_vllm_v0_names() -> None:
    assert read_load(VLLM_V0) == {
        "vllm:num_requests_running": 3.0,
        "vllm:num_requests_waiting": 2.0,
        "vllm:gpu_cache_usage_perc": 0.875,
        "vllm:num_preemptions_total": 7.0,
        "vllm:generation_tokens_total": 123456.0,
    }


def test_read_load_sums_series_and_ignores_created_lines() -> None:
    assert read_load(VLLM_V1) == {
        "vllm:num_requests_running": 3.0,
        "vllm:num_requests_waiting": 4.0,
        "vllm:kv_cache_usage_perc": 0.25,
        "vllm:num_preemptions_total": 3.0,
        "vllm:generation_tokens_total": 15.0,
    }


def test_read_load_of_an_exposition_without_vllm_metrics() -> None:
    assert read_load("# TYPE up gauge\nup 1\n") == {}
    assert read_load("") == {}


def test_read_load_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        read_load("this is { not prometheus\n")


# -- Upstream.record_load -------------------------------------------------------------------------


def test_record_load_falls_back_to_gpu_cache_usage() -> None:
    u = upstream()
    u.record_load(read_load(VLLM_V0), now=1.0)
    assert (u.running, u.waiting, u.kv_usage) == (3.0, 2.0, 0.875)
    u.record_load({"vllm:kv_cache_usage_perc": 0.5, "vllm:gpu_cache_usage_perc": 0.9}, now=2.0)
    assert u.kv_usage == 0.5  # the new name wins when both are exported
    u.record_load({}, now=3.0)
    assert (u.running, u.waiting, u.kv_usage) == (None, None, None)


def test_record_load_preempted_when_the_counter_grows() -> None:
    u = upstream()
    seen = []
    for count in (5.0, 5.0, 6.0, 6.0, 0.0, 2.0):  # 0.0: the engine restarted
        u.record_load({"vllm:num_preemptions_total": count}, now=len(seen))
        seen.append(u.preempted)
    assert seen == [False, False, True, False, False, True]
    u.record_load({}, now=10.0)
    assert u.preempted is False


def gen(tokens: float, running: float) -> dict[str, float]:
    return {"vllm:generation_tokens_total": tokens, "vllm:num_requests_running": running}


def test_record_load_tokens_per_second_per_sequence_smoothed() -> None:
    u = upstream()
    u.record_load(gen(100, 4), now=10.0)
    assert u.tokens_per_second is None  # one sample is no rate
    u.record_load(gen(300, 4), now=12.0)
    assert u.tokens_per_second == pytest.approx(200 / 2 / 4)  # 25 tok/s per sequence
    u.record_load(gen(500, 2), now=14.0)  # sequences over the interval: (4 + 2) / 2
    sample = 200 / 2 / 3
    assert u.tokens_per_second == pytest.approx(0.5 * sample + 0.5 * 25)
    assert u.state().tokens_per_second == u.tokens_per_second


def test_record_load_skips_a_counter_reset_and_a_clock_that_did_not_move() -> None:
    u = upstream()
    u.record_load(gen(1000, 2), now=1.0)
    u.record_load(gen(40, 2), now=2.0)  # engine restarted: no sample, new baseline
    assert u.tokens_per_second is None
    u.record_load(gen(80, 2), now=2.0)  # same instant: no sample
    assert u.tokens_per_second is None
    u.record_load(gen(120, 2), now=3.0)
    assert u.tokens_per_second == pytest.approx(20.0)


def test_record_load_idle_engine_counts_as_fast_again() -> None:
    """policy.py: "an idle engine counts as fast". An engine measured slow once and then idle must
    not stay slow forever: auto sends no work to a slow CPU engine, so it would never be
    measured again."""
    u = upstream()
    u.record_load(gen(0, 4), now=0.0)
    u.record_load(gen(16, 4), now=1.0)
    assert u.tokens_per_second == pytest.approx(4.0)  # slow under load
    u.record_load(gen(16, 0), now=2.0)  # idle now
    u.record_load(gen(16, 0), now=3.0)
    assert u.tokens_per_second is None
    u.record_load(gen(16, 2), now=4.0)  # busy again: measured afresh, not from the stale 4.0
    u.record_load(gen(56, 2), now=5.0)
    assert u.tokens_per_second == pytest.approx(20.0)


# -- Upstream.record_check ------------------------------------------------------------------------


def test_record_check_removes_after_threshold_and_readmits_on_one_success(caplog) -> None:
    u = upstream()
    assert not u.healthy and not u.checked  # until the first check passes
    u.record_check(False, 3)
    assert not u.healthy and u.checked
    u.record_check(True, 3)
    assert u.healthy and u.failures == 0
    caplog.set_level(logging.INFO, logger="heteroserve.router.upstreams")
    for expected in (True, True, False, False):
        u.record_check(False, 3, "HTTP 500")
        assert u.healthy is expected
    assert u.failures == 4
    assert [r.levelno for r in caplog.records] == [logging.WARNING]  # removed once
    assert "HTTP 500" in caplog.records[0].getMessage()
    u.record_check(True, 3)
    assert u.healthy and u.failures == 0


def test_record_check_success_resets_the_failure_streak() -> None:
    u = upstream()
    u.record_check(True, 2)
    for ok in (False, True, False, True, False):
        u.record_check(ok, 2)
    assert u.healthy


def test_mark_down_until_the_next_passing_check() -> None:
    u = upstream()
    u.record_check(True, 3)
    u.mark_down("ConnectError: refused")
    assert not u.healthy and not u.state().healthy
    u.record_check(True, 3)
    assert u.healthy


def test_state_carries_tier_config() -> None:
    u = upstream("http://c:1", "cpu", max_concurrency=7, same_node=True)
    u.in_flight = 2
    state = u.state()
    assert (state.url, state.tier, state.in_flight, state.max_concurrency, state.same_node) == (
        "http://c:1", "cpu", 2, 7, True)


# -- check() and scrape() through httpx.MockTransport ----------------------------------------------


def pool_with(handler: Callable[[httpx.Request], httpx.Response], **cpu_fields
              ) -> tuple[RouterConfig, Callable[[], httpx.AsyncClient]]:
    config = RouterConfig(model="m", policy="cpu",
                          cpu=tier(urls=["http://cpu-a:8000"], **cpu_fields))
    return config, lambda: httpx.AsyncClient(transport=httpx.MockTransport(handler))


def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


@pytest.mark.parametrize(("handler", "healthy"), [
    pytest.param(lambda r: httpx.Response(200, json={"status": "ok"}), True, id="200"),
    pytest.param(lambda r: httpx.Response(500), False, id="500"),
    pytest.param(lambda r: httpx.Response(503), False, id="503"),
    pytest.param(refuse, False, id="connect-error"),
])
def test_check(handler, healthy: bool) -> None:
    seen: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return handler(request)

    config, client = pool_with(record)

    async def scenario() -> Upstream:
        async with client() as http:
            pool = UpstreamPool(config, http)
            (u,) = pool.upstreams.values()
            u.healthy = True
            for _ in range(config.health.failure_threshold):
                await pool.check(u)
            return u

    u = asyncio.run(scenario())
    assert seen == ["http://cpu-a:8000/health"] * 3
    assert u.healthy is healthy
    assert u.failures == (0 if healthy else 3)


def test_check_uses_the_models_path_without_a_health_path() -> None:
    seen: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, json={"data": []})

    config, client = pool_with(record, health_path=None, models_path="/models")

    async def scenario() -> None:
        async with client() as http:
            pool = UpstreamPool(config, http)
            await pool.check_all()
            assert all(u.healthy for u in pool.upstreams.values())

    asyncio.run(scenario())
    assert seen == ["/models"]


@pytest.mark.parametrize(("body", "length"), [
    pytest.param({"object": "list", "data": [{"id": "m", "max_model_len": 4096}]}, 4096,
                 id="vllm"),
    pytest.param({"data": [{"id": "a", "max_model_len": 8192}, {"id": "b", "max_model_len": 2048}]},
                 2048, id="smallest-of-several"),
    pytest.param({"data": [{"id": "m"}]}, None, id="not-reported"),
    pytest.param({"data": [{"id": "m", "max_model_len": None}]}, None, id="null"),
    pytest.param({"data": [{"id": "m", "max_model_len": True}]}, None, id="bool"),
    pytest.param({"data": [{"id": "m", "max_model_len": -1}]}, None, id="negative"),
    pytest.param({"data": [{"id": "m", "max_model_len": "4096"}]}, None, id="string"),
    pytest.param({"data": "nope"}, None, id="data-not-a-list"),
    pytest.param(["not", "an", "object"], None, id="a-list"),
    pytest.param("not json", None, id="not-json"),
])
def test_context_length(body, length: int | None) -> None:
    response = (httpx.Response(200, text=body) if isinstance(body, str)
                else httpx.Response(200, json=body))
    assert context_length(response) == length


def test_context_length_of_a_failed_answer_is_unknown() -> None:
    assert context_length(httpx.Response(404, json={"data": [{"max_model_len": 1}]})) is None
    assert context_length(None) is None


def test_check_reads_the_context_when_an_upstream_is_admitted_and_again_after_it_was_down(
) -> None:
    """The model list is read when a check admits the upstream, not at every check; a
    readmitted upstream (a restarted engine) is read again, and one whose list cannot be read
    is still admitted, its context unknown."""
    seen: list[str] = []
    context = {"length": 4096, "models": 200}

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if request.url.path == "/v1/models":
            if context["models"] != 200:
                raise httpx.ReadTimeout("slow", request=request)
            return httpx.Response(200, json={"data": [{"id": "m",
                                                       "max_model_len": context["length"]}]})
        return httpx.Response(200, json={"status": "ok"})

    config, client = pool_with(record)

    async def scenario() -> list[int | None]:
        lengths = []
        async with client() as http:
            pool = UpstreamPool(config, http)
            (u,) = pool.upstreams.values()
            await pool.check(u)
            await pool.check(u)
            lengths.append(u.max_model_len)
            u.mark_down("refused")
            context["length"] = 2048
            await pool.check(u)
            lengths.append(u.max_model_len)
            u.mark_down("refused")
            context["models"] = 0
            await pool.check(u)
            lengths.append(u.max_model_len)
            assert u.healthy
        return lengths

    assert asyncio.run(scenario()) == [4096, 2048, None]
    assert seen == ["/health", "/v1/models", "/health", "/health", "/v1/models", "/health",
                    "/v1/models"]


@pytest.mark.parametrize(("handler", "running"), [
    pytest.param(lambda r: httpx.Response(200, text=VLLM_V0), 3.0, id="200"),
    pytest.param(lambda r: httpx.Response(500, text=VLLM_V0), None, id="500"),
    pytest.param(lambda r: httpx.Response(200, text="not { prometheus"), None, id="garbage"),
    pytest.param(refuse, None, id="connect-error"),
])
def test_scrape(handler, running: float | None) -> None:
    config, client = pool_with(handler)

    async def scenario() -> Upstream:
        async with client() as http:
            pool = UpstreamPool(config, http)
            (u,) = pool.upstreams.values()
            await pool.scrape(u)  # never raises
            return u

    assert asyncio.run(scenario()).running == running


def test_scrape_all_skips_unhealthy_and_unmetered_upstreams() -> None:
    seen: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        return httpx.Response(200, text=VLLM_V0)

    config = RouterConfig(model="m", accelerator=tier(urls=["http://acc:1"], metrics_path=None),
                          cpu=tier(urls=["http://cpu-up:1", "http://cpu-down:1"]))

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(record)) as http:
            pool = UpstreamPool(config, http)
            for u in pool.upstreams.values():
                u.healthy = "down" not in u.url
            await pool.scrape_all()

    asyncio.run(scenario())
    assert seen == ["cpu-up"]


def test_start_checks_and_scrapes_once_then_stop_cancels() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=VLLM_V0 if request.url.path == "/metrics" else "ok")

    config, client = pool_with(answer)

    async def scenario() -> None:
        async with client() as http:
            pool = UpstreamPool(config, http)
            await pool.start()
            (u,) = pool.upstreams.values()
            assert u.healthy and u.running == 3.0
            assert {t.get_name() for t in pool._tasks} == {"health", "scrape"}
            tasks = list(pool._tasks)
            await pool.stop()
            assert all(t.cancelled() for t in tasks) and pool._tasks == []

    asyncio.run(scenario())


# -- DNS discovery --------------------------------------------------------------------------------


class FakeDns:
    """Answers from `answers` (a list of addresses, or an OSError to raise); records lookups."""

    def __init__(self):
        self.answers: dict[str, list[str] | OSError] = {}
        self.lookups: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append((host, port))
        answer = self.answers[host]
        if isinstance(answer, OSError):
            raise answer
        return answer


def dns_config(*urls: str) -> RouterConfig:
    return RouterConfig(model="m", accelerator=tier(urls=["http://acc-static:8000"]),
                        cpu=tier(urls=list(urls), discovery="dns"))


def cpu_urls(pool: UpstreamPool) -> list[str]:
    return sorted(u.url for u in pool.tier("cpu"))


def test_dns_discovery_adds_and_removes_addresses(caplog) -> None:
    dns = FakeDns()
    pool = UpstreamPool(dns_config("http://cpu-svc:8002"), client=None, resolver=dns)
    assert cpu_urls(pool) == []  # nothing until resolved
    assert [u.url for u in pool.tier("accelerator")] == ["http://acc-static:8000"]
    caplog.set_level(logging.INFO, logger="heteroserve.router.upstreams")

    dns.answers["cpu-svc"] = ["10.0.0.1", "10.0.0.2"]
    asyncio.run(pool.resolve_all())
    assert cpu_urls(pool) == ["http://10.0.0.1:8002", "http://10.0.0.2:8002"]
    kept = pool.get("http://10.0.0.2:8002")
    kept.healthy, kept.in_flight = True, 3

    dns.answers["cpu-svc"] = ["10.0.0.2", "10.0.0.3"]
    asyncio.run(pool.resolve_all())
    assert cpu_urls(pool) == ["http://10.0.0.2:8002", "http://10.0.0.3:8002"]
    assert pool.get("http://10.0.0.2:8002") is kept  # its health and load survive
    assert not pool.get("http://10.0.0.3:8002").healthy  # until its first check
    assert [u.url for u in pool.tier("accelerator")] == ["http://acc-static:8000"]
    assert dns.lookups == [("cpu-svc", 8002)] * 2
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "10.0.0.1:8002 is gone" in messages and "discovered cpu upstream" in messages


def test_dns_failure_keeps_the_known_upstreams() -> None:
    dns = FakeDns()
    pool = UpstreamPool(dns_config("http://cpu-svc:8002"), client=None, resolver=dns)
    dns.answers["cpu-svc"] = ["10.0.0.1"]
    asyncio.run(pool.resolve_all())
    dns.answers["cpu-svc"] = OSError("Temporary failure in name resolution")
    asyncio.run(pool.resolve_all())
    assert cpu_urls(pool) == ["http://10.0.0.1:8002"]
    dns.answers["cpu-svc"] = []  # an answer with no address does empty the tier
    asyncio.run(pool.resolve_all())
    assert cpu_urls(pool) == []


def test_dns_unions_several_service_names() -> None:
    dns = FakeDns()
    pool = UpstreamPool(dns_config("http://svc-a:8002", "http://svc-b:9000"), client=None,
                        resolver=dns)
    dns.answers.update({"svc-a": ["10.0.0.1"], "svc-b": ["10.0.0.1", "fd00::5"]})
    asyncio.run(pool.resolve_all())
    assert cpu_urls(pool) == ["http://10.0.0.1:8002", "http://10.0.0.1:9000",
                              "http://[fd00::5]:9000"]
    dns.answers["svc-a"] = OSError("timeout")
    dns.answers["svc-b"] = ["10.0.0.1"]
    asyncio.run(pool.resolve_all())  # svc-a failed: nothing of the tier is dropped
    assert len(cpu_urls(pool)) == 3


def test_dns_https_url_without_port_resolves_port_443() -> None:
    dns = FakeDns()
    dns.answers["cpu-svc"] = ["10.0.0.1"]
    pool = UpstreamPool(dns_config("https://cpu-svc"), client=None, resolver=dns)
    asyncio.run(pool.resolve_all())
    assert dns.lookups == [("cpu-svc", 443)]
    assert cpu_urls(pool) == ["https://10.0.0.1:443"]
