"""The builtin prefill engine as the operator runs it: a `heteroserve-prefill-engine` process on
loopback (torch on the CPU device here; the same code runs on cuda), the real SmolLM2 model, the
official `openai` client; the KV export of a prefill for a remote decode and its pull."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from heteroserve_engines.cpu_engine.__main__ import default_model
from heteroserve_engines.cpu_engine.gguf_file import GGUFFile, weights_identity
from heteroserve_engines.protocol.kv import KvStreamReader, model_fingerprint
from tests.cluster.harness import free_port
from tests.e2e.conftest import EngineProcess, start_engine, stop_engine
from tests.e2e.test_router import ONE_CORE
from tests.processes import stop_process

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "Name three colors."}]
TOKEN = "prefill-test-token-0123456789"
REMOTE_DECODE = {"kv_transfer_params": {"do_remote_decode": True}}
HANDLE_TIMEOUT_S = 1  # unpulled exports expire quickly; the pull test pulls at once


def start_prefill(tmp: Path, *args: str, wait: bool = True,
                  env: dict[str, str] | None = None) -> EngineProcess:
    """`env` as the CPU engine's (tests/e2e/test_router.py ONE_CORE): OMP_NUM_THREADS sets
    torch's threads, and the process is pinned to CUSTOM_CPU_AFFINITY's CPUs (a comma list; the
    CPU engine pins itself, the prefill engine leaves that to whoever starts it) as soon as it
    exists, long before torch starts a thread (those inherit the mask)."""
    port = free_port()
    log = tmp / f"prefill-{port}.log"
    cpus = (env or {}).get("CUSTOM_CPU_AFFINITY")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "heteroserve_engines.prefill", "--device", "cpu",
             "--port", str(port), "--max-model-len", "512", "--kv-budget-tokens", "2048",
             *args], env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT)
    if cpus:
        os.sched_setaffinity(proc.pid, {int(cpu) for cpu in cpus.split(",")})
    engine = EngineProcess(proc, port, log)
    deadline = time.monotonic() + 120
    while wait and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"engine exited {proc.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return engine
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    if wait:
        raise AssertionError(f"engine did not become healthy: {log.read_text()}")
    return engine


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kv") / "kv-token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def engine(tmp_path_factory, token_file) -> Iterator[EngineProcess]:
    process = start_prefill(tmp_path_factory.mktemp("prefill"), "--kv-token-file",
                            str(token_file), "--kv-handle-timeout", str(HANDLE_TIMEOUT_S))
    try:
        yield process
    finally:
        stop_process(process.proc)


@pytest.fixture(scope="module")
def client(engine):
    return openai.OpenAI(base_url=engine.base_url, api_key="unused", max_retries=0, timeout=120)


def pull(engine: EngineProcess, handle: str, token: str | None = TOKEN) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"http://127.0.0.1:{engine.port}/v1/kv/{handle}", headers=headers,
                     timeout=30)


def wait_for(condition, seconds: float = 15) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_models_and_health(client, engine):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"http://127.0.0.1:{engine.port}/health").json() == {"status": "ok"}


def test_chat_streaming_equals_non_streaming_when_greedy(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24,
                                           temperature=0)
    whole = reply.choices[0].message.content
    assert whole and reply.usage.prompt_tokens > 10
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    parts, reasons, usage = [], [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
    assert "".join(parts) == whole
    assert reasons[-1] == reply.choices[0].finish_reason
    assert usage.completion_tokens == reply.usage.completion_tokens


def test_completions_streaming_and_stop(client):
    free = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12,
                                     temperature=0)
    text = free.choices[0].text
    assert text.strip().startswith("5") and free.choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stream=True))
    assert streamed == text
    stopped = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12,
                                        temperature=0, stop=[" 7"])
    assert stopped.choices[0].finish_reason == "stop"
    assert " 7" not in stopped.choices[0].text and text.startswith(stopped.choices[0].text)


def test_concurrent_requests_match_one_alone(client):
    results: dict[int, str] = {}

    def ask(i):
        results[i] = client.completions.create(model=MODEL, prompt=f"Count to {i + 3}:",
                                               max_tokens=12, temperature=0).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6 and all(results.values())
    alone = client.completions.create(model=MODEL, prompt="Count to 5:", max_tokens=12,
                                      temperature=0).choices[0].text
    assert alone == results[2]


def test_a_remote_decode_prefill_exports_its_kv_once(client, engine):
    prompt = "The capital of France is"
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0,
                                      extra_body=REMOTE_DECODE)
    assert reply.usage.completion_tokens == 1 and reply.choices[0].text == " Paris"
    params = reply.model_extra["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["remote_port"] == engine.port
    assert params["remote_host"] is None and params["remote_block_ids"] is None
    assert params["remote_engine_id"] and params["remote_handle"]
    handle = params["remote_handle"]
    response = pull(engine, handle)
    assert response.status_code == 200
    fingerprint = model_fingerprint(weights_identity(GGUFFile.open(default_model())))
    reader = KvStreamReader(expect_fingerprint=fingerprint)
    events = reader.feed(response.content)
    reader.finish()
    header = events[0][1]
    assert (header.rope, header.n_layer, header.n_head_kv, header.head_dim) == (
        "adjacent", 30, 3, 64)
    assert header.tokens == reply.usage.prompt_tokens == len(header.token_ids)
    layers = [e for e in events if e[0] == "layer"]
    assert [e[1] for e in layers] == list(range(30))
    assert all(len(e[2]) == len(e[3]) == header.tokens * 3 * 64 * 2 for e in layers)
    assert pull(engine, handle).status_code == 404  # freed after one pull
    assert wait_for(lambda: engine.metric("vllm:kv_cache_usage_perc") == 0)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory, token_file) -> Iterator[EngineProcess]:
    """The CPU engine that continues the prefill engine's requests (same KV token)."""
    process = start_engine(tmp_path_factory.mktemp("decoder"), "--max-model-len", "512",
                           "--kv-token-file", str(token_file), env=ONE_CORE[1])
    try:
        yield process
    finally:
        stop_engine(process)


# Prompts whose greedy continuations have clear margins. The CPU engine's own prompt KV (8-bit
# activations) and the prefill engine's (float) differ within the CPU engine's quantization error,
# a few tenths of a logit: enough to flip SmolLM2's many near-ties (measured: chat answers often
# open 0.03-0.3 logits apart, and "January, February, March, April," continues " May, and June."
# from the float KV, as the float model itself does, but " May, June, and July." from the CPU
# engine's own), not these. A wrong layout or RoPE convention is off by 15-20 logits.
HANDOFF_PROMPTS = ["1, 2, 3, 4, 5, 6,", "A, B, C, D, E, F,", "2, 4, 6, 8, 10,",
                   "def add(a, b):\n    return"]


def test_the_cpu_engine_continues_from_the_exported_kv(engine, decoder):
    """The hand-off for real: the prefill engine computes the prompt, the CPU engine pulls its KV
    and decodes without computing the prompt again (all but its last token), as it would have
    from its own prefill."""
    def complete(port: int, prompt: str, max_tokens: int, **extra) -> dict:
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            **extra})
        assert answer.status_code == 200, answer.text
        return answer.json()

    for prompt in HANDOFF_PROMPTS:
        alone = complete(decoder.port, prompt, 8)
        prefilled = complete(engine.port, prompt, 1, kv_transfer_params={"do_remote_decode": True})
        params = {**prefilled["kv_transfer_params"], "remote_host": "127.0.0.1"}
        imported = decoder.metric("heteroserve:kv_imported_tokens_total")
        handed = complete(decoder.port, prompt, 8, kv_transfer_params=params)
        assert decoder.metric("heteroserve:kv_imported_tokens_total") - imported == (
            alone["usage"]["prompt_tokens"] - 1)
        assert handed["choices"][0]["text"] == alone["choices"][0]["text"], prompt
    assert wait_for(lambda: engine.metric("vllm:kv_cache_usage_perc") == 0)


def test_a_streamed_or_imported_prefill_is_refused(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt="Hi", stream=True, extra_body=REMOTE_DECODE)
    assert error.value.body["param"] == "kv_transfer_params"
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt="hello", extra_body={
            "kv_transfer_params": {"do_remote_prefill": True}})
    assert error.value.body["param"] == "kv_transfer_params"


def test_an_unpulled_handle_expires(client, engine):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5,
                                           extra_body=REMOTE_DECODE)
    assert reply.usage.completion_tokens == 1
    handle = reply.model_extra["kv_transfer_params"]["remote_handle"]
    # Refused without this deployment's token (and nothing pulled), then gone once expired.
    assert pull(engine, handle, token=None).status_code == 403
    assert pull(engine, handle, token="wrong-token-wrong-token").status_code == 403
    assert wait_for(lambda: engine.metric("heteroserve:kv_handles") == 0,
                    HANDLE_TIMEOUT_S + 10)
    assert wait_for(lambda: engine.metric("vllm:kv_cache_usage_perc") == 0)
    assert pull(engine, handle).status_code == 404


def test_errors_are_openai_shaped(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=5)
    assert error.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError) as error:
        client.chat.completions.create(model="gpt-9", messages=QUESTION)
    assert error.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt="word " * 600, max_tokens=4)
    assert error.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt="hello", max_tokens=600)
    assert (error.value.body["code"], error.value.body["param"]) == (
        "context_length_exceeded", "max_tokens")


def test_client_disconnect_frees_the_sequence(engine):
    with httpx.stream("POST", f"{engine.base_url}/completions", json={
            "model": MODEL, "prompt": "Tell a very long story.", "max_tokens": 400,
            "stream": True, "ignore_eos": True}, timeout=60) as response:
        lines = response.iter_lines()
        next(lines)
        next(lines)
    assert wait_for(lambda: engine.metric("vllm:num_requests_running") == 0, 10)
    assert engine.metric("vllm:kv_cache_usage_perc") == 0


def test_metrics_use_vllms_names(client, engine):
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=3)
    text = httpx.get(f"http://127.0.0.1:{engine.port}/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_bucket"):
        assert name in text
    assert engine.metric("vllm:generation_tokens_total") >= 3


def test_without_a_kv_token_exports_are_refused_and_a_full_queue_is_429(tmp_path):
    small = start_prefill(tmp_path, "--max-num-seqs", "1", "--max-waiting", "1")
    try:
        client = openai.OpenAI(base_url=small.base_url, api_key="x", max_retries=0,
                               timeout=120)
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(model=MODEL, prompt="Hi", extra_body=REMOTE_DECODE)
        assert error.value.body["param"] == "kv_transfer_params"
        assert "does not export KV" in error.value.body["message"]
        statuses: list[int] = []
        retry_after: list[str] = []

        def ask():
            try:
                client.completions.create(model=MODEL, prompt="Go on:", max_tokens=40,
                                          extra_body={"ignore_eos": True})
                statuses.append(200)
            except openai.RateLimitError as error:
                statuses.append(error.status_code)
                retry_after.append(error.response.headers.get("retry-after"))

        threads = [threading.Thread(target=ask) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 429 in statuses and 200 in statuses
        assert set(retry_after) == {"1"}
    finally:
        stop_process(small.proc)


def test_bad_starts_fail_clearly(tmp_path):
    tp = start_prefill(tmp_path, "--tensor-parallel-size", "2", wait=False)
    assert tp.proc.wait(timeout=60) == 2
    assert "tensor parallelism is not supported" in tp.log.read_text()
    missing = start_prefill(tmp_path, "--model", str(tmp_path / "nope.gguf"), wait=False)
    assert missing.proc.wait(timeout=60) == 2
    assert "does not exist" in missing.log.read_text()
    small_budget = start_prefill(tmp_path, "--kv-budget-tokens", "256", wait=False)
    assert small_budget.proc.wait(timeout=60) == 2
    assert "cannot hold one sequence" in small_budget.log.read_text()
