"""The CPU engine's OpenAI API with the official client: real process, real SmolLM2 model."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest

from tests.e2e.conftest import start_engine, stop_engine
from tests.processes import metric_value

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "Name three colors."}]


def test_models_and_health(client, engine):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(f"http://127.0.0.1:{engine.port}/health").json() == {"status": "ok"}


def test_chat_completion_usage_and_length_finish(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8,
                                           temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant" and choice.message.content
    assert reply.usage.completion_tokens == 8
    assert reply.usage.prompt_tokens > 10
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 8


def test_streaming_equals_non_streaming_when_greedy(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24,
                                           temperature=0)
    whole = reply.choices[0].message.content
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    parts, reasons, usage = [], [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
    assert "".join(parts) == whole
    assert reasons[-1] == reply.choices[0].finish_reason
    assert usage.completion_tokens == reply.usage.completion_tokens


def test_text_completion_and_stop_sequence(client):
    free = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12,
                                     temperature=0)
    text = free.choices[0].text
    assert text.strip().startswith("5")
    stopped = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12,
                                        temperature=0, stop=[" 7"])
    assert stopped.choices[0].finish_reason == "stop"
    assert " 7" not in stopped.choices[0].text
    assert text.startswith(stopped.choices[0].text)


def test_seeded_sampling_is_reproducible(client):
    def sample(seed):
        return client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16,
                                         temperature=0.9, top_p=0.95, seed=seed
                                         ).choices[0].text

    assert sample(11) == sample(11)
    assert len({sample(s) for s in (1, 2, 3)}) > 1


def test_bad_parameter_is_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=5)
    assert error.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=2)
    assert error.value.body["param"] == "messages"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as error:
        client.chat.completions.create(model="gpt-9", messages=QUESTION)
    assert error.value.body["code"] == "model_not_found"


def test_prompt_longer_than_context_is_context_length_exceeded(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt="word " * 600, max_tokens=4)
    assert error.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL, prompt="hello", max_tokens=600)
    assert error.value.body["code"] == "context_length_exceeded"
    assert error.value.body["param"] == "max_tokens"


def labelled(engine, name: str, **labels: str) -> float:
    return metric_value(httpx.get(f"http://127.0.0.1:{engine.port}/metrics").text, name, **labels)


def steps_with_several_sequences(engine) -> float:
    """Engine steps so far in which more than one sequence got a token (from the engine's
    decode batch-size histogram)."""
    return (engine.metric("heteroserve:decode_batch_size_count")
            - labelled(engine, "heteroserve:decode_batch_size_bucket", le="1.0"))


def test_concurrent_requests_are_batched(client, engine):
    batched_before = steps_with_several_sequences(engine)
    results: dict[int, str] = {}

    def ask(i):
        results[i] = client.completions.create(model=MODEL, prompt=f"Count to {i + 3}:",
                                               max_tokens=20, temperature=0).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(results.values())
    assert steps_with_several_sequences(engine) > batched_before
    # Same prompt alone gives the same greedy text as inside the batch.
    alone = client.completions.create(model=MODEL, prompt="Count to 5:", max_tokens=20,
                                      temperature=0).choices[0].text
    assert alone == results[2]


ABANDONED_MAX_TOKENS = 480  # the session engine's context is 512


def abandon(engine, stream: bool) -> tuple[float, float]:
    """Sends a long request (ignore_eos: it can only end at max_tokens), drops the connection
    once the engine's own counter shows it decoding, and waits until the engine is idle and the
    counter still. Returns the request's generated tokens at the drop and in all."""
    body = json.dumps({"model": MODEL, "prompt": "Tell a very long story.", "stream": stream,
                       "max_tokens": ABANDONED_MAX_TOKENS, "ignore_eos": True}).encode()
    before = engine.metric("vllm:generation_tokens_total")
    with socket.create_connection(("127.0.0.1", engine.port)) as client:
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: engine\r\n"
                       b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(body), body))
        deadline = time.monotonic() + 60
        while (engine.metric("vllm:generation_tokens_total") - before < 32
               and time.monotonic() < deadline):
            time.sleep(0.02)
        at_drop = engine.metric("vllm:generation_tokens_total") - before
    last, still_since = -1.0, time.monotonic()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = engine.metric("vllm:generation_tokens_total")
        if now != last or engine.metric("vllm:num_requests_running") > 0:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since > 1.0:
            break
        time.sleep(0.1)
    return at_drop, last - before


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
def test_client_disconnect_frees_the_sequence(engine, stream):
    aborts = labelled(engine, "heteroserve:requests_total", finish_reason="abort")
    at_drop, generated = abandon(engine, stream)
    assert at_drop >= 32
    # Left to itself the request decodes exactly max_tokens; aborted, it stops within the few
    # steps after the drop (at this model's speed well under half of it).
    assert generated < ABANDONED_MAX_TOKENS // 2, (at_drop, generated)
    assert labelled(engine, "heteroserve:requests_total", finish_reason="abort") == aborts + 1
    assert engine.metric("vllm:num_requests_running") == 0
    assert engine.metric("vllm:kv_cache_usage_perc") == 0


def test_metrics_expose_vllm_names(engine, client):
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=3)
    text = httpx.get(f"http://127.0.0.1:{engine.port}/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "heteroserve:generated_tokens"):
        assert name in text


def test_full_queue_answers_429(tmp_path):
    from openai import OpenAI

    small = start_engine(tmp_path, "--max-running", "1", "--max-waiting", "1",
                         "--max-model-len", "512")
    try:
        client = OpenAI(base_url=small.base_url, api_key="x", max_retries=0, timeout=120)
        statuses: list[int] = []

        def ask():
            try:
                client.completions.create(model=MODEL, prompt="Go on:", max_tokens=60,
                                          extra_body={"ignore_eos": True})
                statuses.append(200)
            except openai.RateLimitError as error:
                statuses.append(error.status_code)

        threads = [threading.Thread(target=ask) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 429 in statuses and 200 in statuses
    finally:
        stop_engine(small)


def test_missing_and_corrupt_model_files_fail_clearly(tmp_path):
    missing = start_engine(tmp_path, "--model", str(tmp_path / "nope.gguf"), wait=False)
    assert missing.proc.wait(timeout=60) == 2
    assert "does not exist" in missing.log.read_text()
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\x00" * 64)
    bad = start_engine(tmp_path, "--model", str(corrupt), wait=False)
    assert bad.proc.wait(timeout=60) == 2
    assert "cannot load the model" in bad.log.read_text()


def test_binding_rules_are_enforced_at_start(tmp_path):
    engine = start_engine(tmp_path, env={"OMP_NUM_THREADS": "3", "CUSTOM_CPU_AFFINITY": "0-1"},
                          wait=False)
    assert engine.proc.wait(timeout=60) == 2
    assert "the thread count must equal the number of bound CPUs" in engine.log.read_text()
