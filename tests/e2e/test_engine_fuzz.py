"""A property-based fuzz of the CPU engine's HTTP API (issue 14): hypothesis generates request
bodies - OpenAI-shaped ones whose every field may hold a plausible value, any JSON value, or a
lone surrogate, and raw bytes - sends them to a real engine process over one keep-alive
connection, and holds the server to: never a 5xx, never an error event inside a stream, errors
always in OpenAI's shape, the connection usable after each answer (or closed as announced), and
no sequence left running afterwards.

Bounded: a fixed number of examples, derandomized so that CI sees the same ones every run (about
30 s here). HETEROSERVE_FUZZ_EXAMPLES=N runs N random ones instead, for a longer hunt.
"""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MODEL = "SmolLM2-135M-Instruct"
EXAMPLES = int(os.environ.get("HETEROSERVE_FUZZ_EXAMPLES", "0"))

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
json_value = st.recursive(
    json_leaf, lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
# Text with the odd characters of real abuse: lone surrogates (JSON escapes them as \udXXX),
# a valid pair, control and special-token text.
odd_text = st.one_of(st.text(max_size=40), st.sampled_from(
    ["\ud800", "a\udfff", "\ud83d\ude00", "\x00", "<|im_start|>", "<|im_end|>", ""]))
small_float = st.floats(-3, 3, allow_nan=False) | st.sampled_from([float("nan"), float("inf")])
content_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_audio", "bogus"])},
    optional={"text": odd_text | json_value, "image_url": json_value})
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "bogus"])},
    optional={"content": st.one_of(odd_text, st.none(), st.lists(content_part, max_size=3)),
              "name": odd_text})

FIELDS = {
    "temperature": small_float, "top_p": small_float, "top_k": st.integers(-3, 60000),
    "seed": st.integers(-(2**70), 2**70), "stream": st.booleans(),
    "stop": st.one_of(odd_text, st.lists(odd_text, max_size=5)),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "logprobs": st.one_of(st.booleans(), st.integers(-1, 25)), "top_logprobs": st.integers(-1, 25),
    "frequency_penalty": small_float, "presence_penalty": small_float,
    "logit_bias": st.dictionaries(st.integers(-5, 60000).map(str) | odd_text,
                                  st.floats(-150, 150) | small_float, max_size=4),
    "n": st.integers(-1, 3), "echo": st.booleans(), "ignore_eos": st.booleans(),
    "best_of": st.integers(-1, 3), "suffix": odd_text, "max_completion_tokens": st.integers(-1, 8),
    "response_format": st.fixed_dictionaries({"type": st.sampled_from(
        ["text", "json_object", "json_schema", "bogus"])}),
    "tools": st.lists(json_value, max_size=2), "tool_choice": json_value | st.sampled_from(
        ["none", "auto", "required"]),
    "repetition_penalty": small_float, "min_p": small_float, "min_tokens": st.integers(-1, 4),
    "kv_transfer_params": json_value | st.fixed_dictionaries(
        {"do_remote_decode": st.booleans(), "do_remote_prefill": st.booleans()}),
    "prompt": st.one_of(odd_text, st.lists(st.integers(-5, 60000), max_size=20)),
    "messages": st.lists(message, max_size=3),
}


def body_of(fields: dict) -> bytes:
    return json.dumps(fields).encode()  # ensure_ascii: surrogates go as \udXXX escapes


def mostly(strategy, other, one_in: int = 8):
    """`strategy`, and `other` about once in `one_in` draws."""
    return st.integers(0, one_in - 1).flatmap(lambda i: other if i == 0 else strategy)


# Abusive: every field may hold a plausible value, any JSON value, or nothing.
abusive_body = st.fixed_dictionaries(
    {"model": st.sampled_from([MODEL, MODEL, MODEL, "", "gpt-9"]),
     "max_tokens": st.integers(-1, 8)},
    optional={name: mostly(strategy, json_value) for name, strategy in FIELDS.items()},
).map(body_of)
# Valid-leaning: what a client may well send, so that generation (streamed, with logprobs,
# penalties, biases, stops) runs too, not only validation.
SAMPLING = {
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 80),
    "seed": st.integers(-(2**70), 2**70), "stream": st.booleans(), "ignore_eos": st.booleans(),
    "stop": st.one_of(odd_text, st.lists(odd_text, max_size=4)),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "frequency_penalty": st.floats(-2, 2), "presence_penalty": st.floats(-2, 2),
    "logit_bias": st.dictionaries(st.integers(0, 49151).map(str), st.floats(-100, 100),
                                  max_size=4),
}
text_message = st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant", "user"]),
    "content": st.one_of(odd_text, st.lists(st.fixed_dictionaries(
        {"type": st.just("text"), "text": odd_text}), max_size=2))})
chat_body = st.fixed_dictionaries(
    {"model": st.just(MODEL), "max_tokens": st.integers(1, 8),
     "messages": st.lists(text_message, min_size=1, max_size=3)},
    optional={**SAMPLING, "logprobs": st.booleans(), "top_logprobs": st.integers(0, 20)},
).map(body_of)
completion_body = st.fixed_dictionaries(
    {"model": st.just(MODEL), "max_tokens": st.integers(1, 8),
     "prompt": st.one_of(odd_text, st.lists(st.integers(0, 49151), min_size=1, max_size=20))},
    optional={**SAMPLING, "logprobs": st.integers(0, 20), "echo": st.booleans()},
).map(body_of)
raw_body = st.one_of(
    st.binary(max_size=200),
    abusive_body.flatmap(lambda body: st.integers(0, len(body)).map(lambda cut: body[:cut])),
    st.integers(1, 3000).map(lambda depth: b"[" * depth + b"]" * depth),
)
ENDPOINTS = ["/v1/completions", "/v1/chat/completions"]
request = st.one_of(
    st.tuples(st.just("POST"), st.just("/v1/chat/completions"), chat_body),
    st.tuples(st.just("POST"), st.just("/v1/completions"), completion_body),
    st.tuples(st.just("POST"), st.sampled_from(ENDPOINTS), abusive_body),
    st.tuples(st.just("POST"), st.sampled_from(ENDPOINTS), raw_body),
    st.tuples(st.sampled_from(["GET", "PUT", "DELETE", "POST"]),
              st.sampled_from([*ENDPOINTS, "/v1/models", "/health", "/metrics", "/v1/nope",
                               "/v1/kv/abc", "/"]), raw_body),
)


@pytest.fixture(scope="module")
def http(engine):
    with httpx.Client(base_url=f"http://127.0.0.1:{engine.port}", timeout=120) as client:
        yield client


def check(http: httpx.Client, method: str, path: str, body: bytes) -> None:
    response = http.request(method, path, content=body,
                            headers={"content-type": "application/json"})
    assert response.status_code < 500, (method, path, body[:300], response.text[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, response.text
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
        assert response.text.endswith("data: [DONE]\n\n"), response.text[-300:]
        assert '"error"' not in response.text, response.text[:500]
    # The same pooled connection (or a fresh one, where the server said Connection: close)
    # serves the next request.
    assert http.get("/health").status_code == 200


settings.register_profile("engine-fuzz", max_examples=EXAMPLES or 400, deadline=None,
                          derandomize=not EXAMPLES, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                 HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])


@settings(settings.get_profile("engine-fuzz"))
@given(request)
def test_generated_requests_get_no_server_error(http, engine, req):
    check(http, *req)


def test_no_sequence_is_left_running(engine, http):
    """After the fuzz (same module, runs later), nothing it started is still decoding."""
    deadline = time.monotonic() + 15
    while engine.metric("vllm:num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert engine.metric("vllm:num_requests_running") == 0
    assert engine.metric("vllm:num_requests_waiting") == 0
