"""The router as users run it: `heteroserve-router` processes on loopback in front of real CPU
engines (a second CPU engine with one running slot stands in for the accelerator tier), the
real SmolLM2 model and the official `openai` client. Failure paths that a real engine cannot be
made to show on demand (slow, stalled, flapping) use the canned upstream."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest
from openai import APIStatusError, OpenAI

from tests.cluster.harness import free_port
from tests.e2e.conftest import EngineProcess, start_engine, stop_engine
from tests.e2e.routers import (
    start_canned,
    start_router,
    stop_router,
    wait_until,
)
from tests.processes import stop_process

MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "Name three colors."}]
# Each engine gets one thread on its own core: two pinned pools on the same two cores would
# only measure how they share them.
ONE_CORE = [{"OMP_NUM_THREADS": "1", "CUSTOM_CPU_AFFINITY": str(cpu)}
            for cpu in (0, min(1, os.cpu_count() - 1))]


@pytest.fixture(scope="module")
def cpu_engine(tmp_path_factory):
    engine = start_engine(tmp_path_factory.mktemp("cpu"), "--max-model-len", "512",
                          env=ONE_CORE[1])
    yield engine
    stop_engine(engine)


@pytest.fixture(scope="module")
def accel_engine(tmp_path_factory):
    """The accelerator tier's stand-in: one running slot, so a second request waits (a context
    long enough for _hold's streams)."""
    engine = start_engine(tmp_path_factory.mktemp("accel"), "--max-model-len", "4096",
                          "--max-running", "1", env=ONE_CORE[0])
    yield engine
    stop_engine(engine)


def tiers(accel: EngineProcess | None = None, cpu: EngineProcess | None = None,
          **extra) -> dict:
    config = {"model": MODEL, **extra}
    if accel:
        config["accelerator"] = {"urls": [f"http://127.0.0.1:{accel.port}"]}
    if cpu:
        config["cpu"] = {"urls": [f"http://127.0.0.1:{cpu.port}"]}
    return config


def client_for(router, **kwargs) -> OpenAI:
    return OpenAI(base_url=router.base_url, api_key="unused", max_retries=0, timeout=60,
                  **kwargs)


@pytest.fixture
def router_factory(tmp_path):
    started = []

    def make(config: dict, **kwargs):
        router = start_router(tmp_path, config, **kwargs)
        started.append(router)
        return router
    yield make
    for router in started:
        stop_router(router)


# -- serving under each policy --------------------------------------------------------------------

@pytest.mark.parametrize(("policy", "tier"), [("cpu", "cpu"), ("accelerator", "accelerator"),
                                              ("auto", "accelerator")])
def test_each_policy_serves_chat_and_completions(policy, tier, accel_engine, cpu_engine,
                                                 router_factory):
    router = router_factory(tiers(accel_engine, cpu_engine, policy=policy))
    client = client_for(router)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    assert raw.headers["x-heteroserve-tier"] == tier
    chat = raw.parse()
    assert chat.choices[0].message.content and chat.usage.completion_tokens > 0

    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content  # greedy: the same text either way
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens

    completion = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=8,
                                           temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="The sky is", max_tokens=8, temperature=0, stream=True))
    assert streamed == completion.choices[0].text and completion.choices[0].text

    assert router.metric("heteroserve_router_requests_total", tier=tier,
                         outcome="success") == 4
    assert router.metric("heteroserve_router_decisions_total", policy=policy, tier=tier) == 4


def test_split_is_refused_until_the_kv_hand_off_exists(accel_engine, cpu_engine,
                                                       router_factory):
    router = router_factory(tiers(accel_engine, cpu_engine, policy="split"))
    with pytest.raises(APIStatusError) as error:
        client_for(router).chat.completions.create(model=MODEL, messages=MESSAGES,
                                                   max_tokens=4)
    assert error.value.status_code == 501
    assert error.value.body["code"] == "split_unavailable"


def test_models_give_the_smallest_context_of_the_tiers(accel_engine, cpu_engine, router_factory):
    """The engines report their --max-model-len; a request may land on either tier, so the
    router's list gives the smaller, and a router of one tier that tier's."""
    for engine, length in ((accel_engine, 4096), (cpu_engine, 512)):
        card = OpenAI(base_url=f"http://127.0.0.1:{engine.port}/v1", api_key="unused",
                      max_retries=0).models.list().data[0]
        assert card.max_model_len == length
    both = client_for(router_factory(tiers(accel_engine, cpu_engine, policy="auto")))
    assert [m.max_model_len for m in both.models.list()] == [512]
    assert both.models.retrieve(MODEL).max_model_len == 512
    accelerator = client_for(router_factory(tiers(accel_engine, policy="accelerator")))
    assert [m.max_model_len for m in accelerator.models.list()] == [4096]


def test_models_and_errors_in_openai_shape(cpu_engine, router_factory):
    router = router_factory(tiers(cpu=cpu_engine, policy="cpu"))
    client = client_for(router)
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(APIStatusError) as error:
        client.chat.completions.create(model="other", messages=MESSAGES)
    assert error.value.status_code == 404 and error.value.body["code"] == "model_not_found"
    for method, path, status in (("GET", "/nope", 404), ("DELETE", "/v1/models", 405)):
        response = httpx.request(method, router.url + path)
        assert response.status_code == status and "message" in response.json()["error"]
    big = httpx.post(router.base_url + "/chat/completions", content=b"x" * (5 * 2**20),
                     headers={"content-type": "application/json"})
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"


# -- auto: offload under load, and back ------------------------------------------------------------

def _hold(url: str, stop: threading.Event, started: threading.Event) -> None:
    """A long stream straight to the engine, held open until `stop`: 4000 tokens, which no
    engine here decodes before the test is done with it. 400, about 3 s on one core, once ended
    on its own in CI before the three requests were through, and the accelerator's queue with
    it. Returning closes the stream; the engine aborts the request on the disconnect."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4000,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        for _ in response.iter_lines():
            started.set()
            if stop.is_set():
                return


def test_auto_offloads_when_the_accelerator_queues_and_comes_back(
        accel_engine, cpu_engine, router_factory):
    # No floor on the CPU tier's measured speed: this test is about the queue. A one-core engine
    # on a loaded CI machine can measure below the default 10 tok/s, and `auto` then sends the
    # next requests to the queued accelerator as "cpu_slow" (the likely cause of one CI run's
    # timeout here, with the hold streams no longer ending on their own).
    router = router_factory(tiers(accel_engine, cpu_engine, policy="auto",
                                  offload={"holdSeconds": 0.5, "waitingThreshold": 1,
                                           "minCpuTokensPerSecond": 0}))
    client = client_for(router)
    accel = f"http://127.0.0.1:{accel_engine.port}"

    def tier_of_next_request() -> str:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=4)
        raw.parse()
        return raw.headers["x-heteroserve-tier"]

    assert tier_of_next_request() == "accelerator"
    # Load the accelerator directly: one request runs (its only slot), the next one waits.
    stop = threading.Event()
    holders = []
    for _ in range(2):
        started = threading.Event()
        thread = threading.Thread(target=_hold, args=(accel, stop, started), daemon=True)
        thread.start()
        holders.append((thread, started))
    try:
        wait_until(lambda: router.metric("heteroserve_router_upstream_waiting",
                                         tier="accelerator") >= 1, 30,
                   lambda: "the router never saw the accelerator's queue")
        offloaded = [tier_of_next_request() for _ in range(3)]
        assert offloaded == ["cpu"] * 3, router.metrics()
        assert router.metric("heteroserve_router_offloads_total",
                             reason="accelerator_queue") == 3
    finally:
        stop.set()
        for thread, _ in holders:
            thread.join(timeout=30)
    # Load gone: after the hold time, new requests go back to the accelerator.
    wait_until(lambda: router.metric("heteroserve_router_upstream_waiting",
                                     tier="accelerator") == 0
               and accel_engine.metric("vllm:num_requests_running") == 0, 30,
               lambda: "the accelerator's load did not fall")
    wait_until(lambda: tier_of_next_request() == "accelerator", 10,
               lambda: "auto never moved back to the accelerator", interval=0.2)
    assert router.metric("heteroserve_router_decisions_total", policy="auto",
                         tier="accelerator", reason="accelerator_has_room") >= 2


# -- failure paths ---------------------------------------------------------------------------------

def test_upstream_down_at_start_is_admitted_once_it_answers(tmp_path, router_factory):
    canned_port = free_port()
    router = router_factory({"model": MODEL, "policy": "cpu",
                             "cpu": {"urls": [f"http://127.0.0.1:{canned_port}"]}},
                            wait_ready=False)
    assert not router.ready()
    response = httpx.post(router.base_url + "/chat/completions",
                          json={"model": MODEL, "messages": MESSAGES})
    assert response.status_code == 503 and response.headers["retry-after"]
    assert response.json()["error"]["code"] == "cpu_unavailable"
    canned = start_canned(port=canned_port)
    try:
        wait_until(router.ready, 10, lambda: "the upstream was never admitted")
        chat = client_for(router).chat.completions.create(model=MODEL, messages=MESSAGES,
                                                          max_tokens=3)
        assert chat.choices[0].message.content == "tok " * 3
    finally:
        stop_process(canned.proc)


def _sse_events(response: httpx.Response):
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[6:]


def test_engine_killed_mid_stream_ends_the_stream_with_an_error_and_done(tmp_path,
                                                                         router_factory):
    engine = start_engine(tmp_path, "--max-model-len", "512", env=ONE_CORE[1])
    try:
        router = router_factory(tiers(cpu=engine, policy="cpu"))
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 400, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", router.base_url + "/chat/completions", json=body,
                          timeout=30) as response:
            events = _sse_events(response)
            for _ in range(3):
                json.loads(next(events))
            engine.proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            rest = list(events)
            ended = time.monotonic() - killed
        assert rest[-1] == "[DONE]"
        error = json.loads(rest[-2])["error"]
        assert error["code"] == "upstream_stream_error"
        assert ended < 1.0
        assert router.metric("heteroserve_router_requests_total",
                             outcome="upstream_error") == 1
        # The refused connection afterwards marks it down at once: the next request is 503.
        late = httpx.post(router.base_url + "/chat/completions", json=body, timeout=10)
        assert late.status_code in (502, 503)
    finally:
        stop_engine(engine)


def test_slow_upstream_times_out_before_and_after_the_first_byte(router_factory):
    silent = start_canned("--first-byte-delay", "30")
    stalled = start_canned("--stall-after", "3")
    try:
        router = router_factory({"model": MODEL, "policy": "cpu", "idleTimeoutSeconds": 1,
                                 "retries": 0,
                                 "cpu": {"urls": [silent.url]}})
        started = time.monotonic()
        response = httpx.post(router.base_url + "/chat/completions", timeout=30, json={
            "model": MODEL, "messages": MESSAGES, "stream": True})
        assert response.status_code == 504, response.text
        assert time.monotonic() - started < 5

        router = router_factory({"model": MODEL, "policy": "cpu", "idleTimeoutSeconds": 1,
                                 "cpu": {"urls": [stalled.url]}})
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 50, "stream": True}
        with httpx.stream("POST", router.base_url + "/chat/completions", json=body,
                          timeout=30) as response:
            events = list(_sse_events(response))
        assert len(events) == 3 + 2 and events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "upstream_stream_error"
    finally:
        stop_process(silent.proc)
        stop_process(stalled.proc)


def test_flapping_upstream_is_removed_and_readmitted(tmp_path, router_factory):
    down = tmp_path / "down"
    canned = start_canned("--health-file", str(down))
    try:
        router = router_factory({"model": MODEL, "policy": "cpu", "cpu": {"urls": [canned.url]}})
        chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
        for _ in range(3):
            down.touch()
            wait_until(lambda: not router.ready(), 5, lambda: "never removed")
            assert httpx.post(router.base_url + "/chat/completions", json=chat
                              ).status_code == 503
            down.unlink()
            wait_until(router.ready, 5, lambda: "never re-admitted")
            assert httpx.post(router.base_url + "/chat/completions", json=chat
                              ).status_code == 200
        assert router.metric("heteroserve_router_requests_total", outcome="success") == 3
        assert router.metric("heteroserve_router_requests_total", outcome="refused") == 3
    finally:
        stop_process(canned.proc)


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
def test_client_disconnect_stops_the_engine_generating(stream, cpu_engine, router_factory):
    router = router_factory(tiers(cpu=cpu_engine, policy="cpu"))
    before = cpu_engine.metric("vllm:generation_tokens_total")
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 400, "ignore_eos": True,
            "stream": stream}
    with httpx.Client(timeout=30) as client:
        if stream:
            with client.stream("POST", router.base_url + "/chat/completions",
                               json=body) as response:
                events = _sse_events(response)
                for _ in range(3):
                    next(events)
        else:
            with pytest.raises(httpx.ReadTimeout):
                client.post(router.base_url + "/chat/completions", json=body, timeout=1.0)
    left = time.monotonic()
    # The engine's own counters: its sequence is gone and its token counter stops.
    wait_until(lambda: cpu_engine.metric("vllm:num_requests_running") == 0, 1.0,
               lambda: "the engine still decodes for a client that left")
    stopped_after = time.monotonic() - left
    settled = cpu_engine.metric("vllm:generation_tokens_total")
    wait_until(lambda: router.metric("heteroserve_router_requests_total",
                                     outcome="client_disconnect") == 1, 2,
               lambda: "the router did not count the disconnect")
    assert cpu_engine.metric("vllm:generation_tokens_total") == settled
    assert settled - before < 400, "generated to max_tokens for nobody"
    assert stopped_after < 1.0


def test_auto_offloads_when_the_accelerator_kv_cache_fills(tmp_path, cpu_engine,
                                                           router_factory):
    """The issue's stand-in: a second CPU engine with a small KV budget (512 tokens) as the
    accelerator tier; one long prompt fills it past the threshold."""
    small = start_engine(tmp_path, "--max-model-len", "512", "--kv-cache-gib", "0.0001",
                         env=ONE_CORE[0])
    try:
        router = router_factory(tiers(small, cpu_engine, policy="auto",
                                      offload={"holdSeconds": 0.5}))
        client = client_for(router)

        def tier_of_next_request() -> str:
            raw = client.completions.with_raw_response.create(model=MODEL, prompt="Hi",
                                                             max_tokens=2)
            raw.parse()
            return raw.headers["x-heteroserve-tier"]

        assert tier_of_next_request() == "accelerator"
        stop, started = threading.Event(), threading.Event()
        prompt = [1] * 470  # 30 of the engine's 32 blocks once prefilled: 94 % > 90 %

        def hold() -> None:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 40, "ignore_eos": True,
                    "stream": True}
            with httpx.stream("POST", f"http://127.0.0.1:{small.port}/v1/completions",
                              json=body, timeout=60) as response:
                for _ in response.iter_lines():
                    started.set()
                    if stop.is_set():
                        return

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        try:
            wait_until(lambda: router.metric("heteroserve_router_upstream_kv_cache_usage",
                                             tier="accelerator") > 0.9, 30,
                       lambda: "the router never saw the accelerator's KV usage")
            assert tier_of_next_request() == "cpu"
            assert router.metric("heteroserve_router_offloads_total",
                                 reason="accelerator_kv_pressure") == 1
        finally:
            stop.set()
            holder.join(timeout=30)
        wait_until(lambda: router.metric("heteroserve_router_upstream_kv_cache_usage",
                                         tier="accelerator") < 0.8, 30,
                   lambda: "the accelerator's KV usage did not fall")
        wait_until(lambda: tier_of_next_request() == "accelerator", 10,
                   lambda: "auto never moved back to the accelerator", interval=0.2)
    finally:
        stop_engine(small)
