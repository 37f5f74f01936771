"""The CPU engine's server under bad input, abuse and shutdown (issue 14): a real engine process
with the real SmolLM2 model, spoken to with raw sockets (to see exactly what is on the wire and
whether a keep-alive connection survives), httpx and the official `openai` client."""

from __future__ import annotations

import json
import math
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from tests.e2e.conftest import start_engine, stop_engine
from tests.processes import metric_value

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "Name three colors."}]

# -- raw HTTP/1.1 over one socket ---------------------------------------------------------------


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response with a Content-Length body: (status, lower-cased headers, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            raise ConnectionError(f"closed before a response: {data!r}")
        data += piece
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        piece = sock.recv(65536)
        if not piece:
            raise ConnectionError("closed inside a response body")
        rest += piece
    return status, headers, rest[:length]


def send_request(sock: socket.socket, method: str, path: str, body: bytes = b"",
                 length: int | None = None) -> None:
    head = (f"{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n")
    sock.sendall(head.encode() + body)


def assert_openai_error(status: int, headers: dict[str, str], body: bytes, expected: int
                        ) -> dict:
    assert status == expected, body
    assert headers["content-type"].startswith("application/json"), headers
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def assert_connection_usable(sock: socket.socket, headers: dict[str, str]) -> None:
    """After an error the same connection answers the next request, unless the error said
    `Connection: close` (then the server closes it, as the client was told)."""
    if headers.get("connection", "").lower() == "close":
        assert sock.recv(1) == b""
        return
    send_request(sock, "GET", "/v1/models")
    status, _, body = read_response(sock)
    assert status == 200 and json.loads(body)["data"][0]["id"] == MODEL


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """An engine with a small body limit, a 4096-token context, one thread (--threads)."""
    process = start_engine(tmp_path_factory.mktemp("small"), "--max-model-len", "4096",
                           "--max-body-bytes", "65536", "--threads", "1")
    try:
        yield process
    finally:
        stop_engine(process)


# -- bodies too large, and work that would stall the event loop ----------------------------------


def test_oversized_body_is_413_before_it_is_read(engine):
    sock = connect(engine.port)
    try:
        # 10 MB announced, 64 KiB sent: the answer must come without the rest.
        send_request(sock, "POST", "/v1/chat/completions", b"x" * 65536, length=10_000_000)
        status, headers, body = read_response(sock)
        error = assert_openai_error(status, headers, body, 413)
        assert error["code"] == "request_too_large"
        assert headers.get("connection") == "close"
    finally:
        sock.close()


def test_oversized_body_does_not_grow_memory_and_stays_413(engine):
    before = rss_bytes(engine.proc.pid)
    content = "word " * 2_000_000  # 10 MB of prompt in one message
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}]})
    for _ in range(3):
        response = httpx.post(f"{engine.base_url}/chat/completions", content=body,
                              headers={"content-type": "application/json"}, timeout=60)
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
    # Chunked (no Content-Length): counted as it arrives.
    chunks = (body[i:i + 1 << 20].encode() for i in range(0, len(body), 1 << 20))
    response = httpx.post(f"{engine.base_url}/chat/completions", content=chunks,
                          headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code == 413
    assert rss_bytes(engine.proc.pid) - before < 64 << 20


def test_body_limit_is_configurable(small):
    body = {"model": MODEL, "prompt": "x" * 70_000, "max_tokens": 1}
    response = httpx.post(f"{small.base_url}/completions", json=body, timeout=60)
    assert response.status_code == 413
    assert "65536" in response.json()["error"]["message"]
    body["prompt"] = "Hello"
    assert httpx.post(f"{small.base_url}/completions", json=body, timeout=60).status_code == 200


def test_large_prompts_stall_neither_a_stream_nor_health(engine):
    """Big bodies under the limit are refused (context length) without tokenizing them on the
    event loop: a running stream keeps its pace and /health answers at once."""
    gaps: list[float] = []
    finished: list[str | None] = []

    def stream():
        with httpx.stream("POST", f"{engine.base_url}/completions", json={
                "model": MODEL, "prompt": "Once upon a time", "max_tokens": 300,
                "ignore_eos": True, "stream": True, "temperature": 0}, timeout=120) as response:
            last = None
            for line in response.iter_lines():
                now = time.monotonic()
                if line.startswith("data: {"):
                    if last is not None:
                        gaps.append(now - last)
                    last = now
                    finished.append(json.loads(line[6:])["choices"][0]["finish_reason"])

    runner = threading.Thread(target=stream)
    runner.start()
    deadline = time.monotonic() + 60
    while not gaps and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gaps, "the stream never started"
    big = "lorem ipsum dolor sit amet " * 120_000  # 3.2 MB: under the default limit
    health: list[float] = []
    results: list[httpx.Response] = []

    def post(payload):
        results.append(httpx.post(f"{engine.base_url}/chat/completions", json=payload,
                                  timeout=120))

    posts = [threading.Thread(target=post, args=({"model": MODEL, "messages": [
        {"role": "user", "content": big}]},)) for _ in range(2)]
    for t in posts:
        t.start()
    while any(t.is_alive() for t in posts):
        started = time.monotonic()
        assert httpx.get(f"http://127.0.0.1:{engine.port}/health", timeout=30).status_code == 200
        health.append(time.monotonic() - started)
        time.sleep(0.02)
    for t in posts:
        t.join()
    runner.join()
    assert [r.status_code for r in results] == [400, 400]
    assert all(r.json()["error"]["code"] == "context_length_exceeded" for r in results)
    assert finished[-1] == "length"
    assert max(health, default=0) < 1.0, health
    assert max(gaps) < 1.0, max(gaps)


# -- malformed input: OpenAI-shaped 400s, and the connection survives ----------------------------

SURROGATE_BODIES = [
    # The JSON escape of a lone UTF-16 surrogate: valid JSON, not valid Unicode.
    b'{"model": "%s", "messages": [{"role": "user", "content": "\\ud800"}]}' % MODEL.encode(),
    b'{"model": "%s", "messages": [{"role": "user", "content": [{"type": "text", '
    b'"text": "a\\udfff"}]}]}' % MODEL.encode(),
    b'{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "stop": ["\\udc00"]}'
    % MODEL.encode(),
]


@pytest.mark.parametrize("body", SURROGATE_BODIES)
def test_lone_surrogate_is_a_400_and_the_connection_survives(engine, body):
    sock = connect(engine.port)
    try:
        send_request(sock, "POST", "/v1/chat/completions", body)
        status, headers, answer = read_response(sock)
        assert "surrogate" in assert_openai_error(status, headers, answer, 400)["message"]
        assert_connection_usable(sock, headers)
    finally:
        sock.close()


def test_lone_surrogate_is_named_by_its_parameter(engine):
    for body, param in ((b'{"model": "%s", "prompt": "abc\\ud800"}', "prompt"),
                        (b'{"model": "%s", "prompt": "a", "stop": ["x", "\\uDBFF!"]}',
                         "stop.1"),
                        (b'{"model": "%s", "prompt": "a", "\\udc01": 1}', "\\udc01")):
        response = httpx.post(f"{engine.base_url}/completions", content=body % MODEL.encode(),
                              headers={"content-type": "application/json"}, timeout=60)
        assert response.status_code == 400 and response.json()["error"]["param"] == param
    # A pair of surrogate escapes is one valid character.
    response = httpx.post(f"{engine.base_url}/completions", headers={
        "content-type": "application/json"}, timeout=60,
        content=b'{"model": "%s", "prompt": "\\ud83d\\ude00", "max_tokens": 1}'
        % MODEL.encode())
    assert response.status_code == 200


@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"model": "%s", "prompt": "hi", "stop": ' % MODEL.encode() + b"[" * 50_000,
    b'{"model": "%s", "messages": [{"role": "user", "content": [' % MODEL.encode()
    + b'{"a": ' * 5_000 + b"1" + b"}" * 5_000 + b"]}]}",
])
def test_deeply_nested_json_is_a_400_and_the_connection_survives(engine, body):
    sock = connect(engine.port)
    try:
        send_request(sock, "POST", "/v1/chat/completions", body)
        status, headers, answer = read_response(sock)
        assert_openai_error(status, headers, answer, 400)
        assert_connection_usable(sock, headers)
    finally:
        sock.close()


# -- parameters: implemented, or refused by name --------------------------------------------------


def test_chat_logprobs_have_openai_shape(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12,
                                           temperature=0, logprobs=True, top_logprobs=4)
    choice = reply.choices[0]
    content = choice.logprobs.content
    # one entry per token: all 12, or fewer where the answer ended by itself
    assert len(content) == reply.usage.completion_tokens > 0
    assert len(content) == 12 or choice.finish_reason == "stop"
    assert "".join(t.token for t in content) == choice.message.content
    for entry in content:
        assert len(entry.top_logprobs) == 4
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True) and all(lp <= 0 for lp in tops)
        # Greedy: the chosen token is the most probable one.
        assert entry.token == entry.top_logprobs[0].token
        assert math.isclose(entry.logprob, tops[0], abs_tol=1e-5)
        assert bytes(entry.bytes).decode() == entry.token
    # Streamed, the same tokens and log-probabilities arrive chunk by chunk.
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12,
                                            temperature=0, logprobs=True, top_logprobs=4,
                                            stream=True)
    streamed = [entry for chunk in stream for c in chunk.choices
                if c.logprobs and c.logprobs.content for entry in c.logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert all(math.isclose(a.logprob, b.logprob, abs_tol=1e-5)
               for a, b in zip(streamed, content, strict=True))
    # Without logprobs there are none.
    plain = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_have_openai_shape(client):
    reply = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=8,
                                      temperature=0, logprobs=3)
    choice = reply.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    assert "".join(lp.tokens) == choice.text
    offsets = [sum(len(t) for t in lp.tokens[:i]) for i in range(8)]
    assert lp.text_offset == offsets
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == 3 and max(top.values()) == pytest.approx(logprob, abs=1e-5)
        assert top[token] == pytest.approx(logprob, abs=1e-5)
    # Sampled tokens have their own (lower or equal) log-probability.
    drawn = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=8,
                                      temperature=1.5, seed=4, logprobs=0).choices[0].logprobs
    assert all(lp <= 0 for lp in drawn.token_logprobs) and drawn.top_logprobs == [{}] * 8


def completion_lp(client, prompt: str = "1, 2, 3, 4,", **extra
                  ) -> tuple[list[str], list[dict[str, float]]]:
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10 if prompt ==
                                      "1, 2, 3, 4," else 16, temperature=0, logprobs=20, **extra)
    lp = reply.choices[0].logprobs
    return lp.tokens, lp.top_logprobs


def test_logit_bias_bans_and_forces_tokens(client):
    tokens, tops = completion_lp(client)
    first = tokens[0]
    # Banned (-100), the first token becomes the runner-up of the unbiased distribution.
    token_id = token_id_of(first)
    banned, banned_tops = completion_lp(client, logit_bias={str(token_id): -100})
    runner_up = sorted(tops[0].items(), key=lambda kv: -kv[1])[1][0]
    assert banned[0] == runner_up and first not in banned
    # Log-probabilities are of the biased distribution (OpenAI's): the banned token is gone.
    assert first not in banned_tops[0]
    # Forced (+100): every token is the forced one.
    forced, forced_tops = completion_lp(client, logit_bias={str(token_id): 100})
    assert forced == [first] * 10
    assert forced_tops[0][first] == pytest.approx(0.0, abs=1e-4)


def token_id_of(token: str) -> int:
    """A token's id, from the model's own tokenizer."""
    from heteroserve_engines.cpu_engine.__main__ import default_model
    from heteroserve_engines.cpu_engine.gguf_model import open_gguf
    from heteroserve_engines.cpu_engine.tokenizer import GGUFTokenizer

    tok = GGUFTokenizer.from_gguf(open_gguf(default_model()))
    ids = tok.encode(token, add_bos=False)
    assert len(ids) == 1, ids
    return ids[0]


def penalty_moves_gaps(client, prompt: str, kind: str, value: float) -> tuple[bool, int]:
    """Up to the first token where the penalized greedy output leaves the plain one (or over the
    whole output if it never does), both saw the same context, so the log-probability gap
    between any two tokens moves by exactly the penalty's difference: presence p for a token
    seen, frequency f times its count. (whether it left the plain output, pairs checked)"""
    plain, plain_tops = completion_lp(client, prompt)
    penalized, penalized_tops = completion_lp(client, prompt, **{kind: value})
    diverged = next((i for i, (a, b) in enumerate(zip(plain, penalized, strict=True)) if a != b),
                    None)
    checked = 0
    for step in range(len(plain) if diverged is None else diverged + 1):
        seen = plain[:step]

        def penalty(token, seen=seen):
            count = seen.count(token)
            return value * (count > 0) if kind == "presence_penalty" else value * count

        common = [t for t in plain_tops[step] if t in penalized_tops[step]]
        base = common[0]
        for token in common[1:]:
            expected = (plain_tops[step][token] - plain_tops[step][base]
                        - penalty(token) + penalty(base))
            got = penalized_tops[step][token] - penalized_tops[step][base]
            assert got == pytest.approx(expected, abs=2e-3), (value, step, token)
            checked += 1
    return diverged is not None, checked


@pytest.mark.parametrize("kind", ["presence_penalty", "frequency_penalty"])
def test_penalties_lower_repeated_tokens_by_their_definition(client, kind):
    prompt = "The cat sat on the mat. The cat sat on the"
    # Greedy, the plain output repeats "The cat sat on the"; penalized, it leaves it.
    left, checked = penalty_moves_gaps(client, prompt, kind, 2.0)
    assert left and checked > 10
    # A negative penalty raises the seen tokens by the same definition (encourages repetition;
    # the plain output already repeats, so the penalized one may well stay the same).
    _, checked = penalty_moves_gaps(client, prompt, kind, -2.0)
    assert checked > 10


def test_top_k_minus_one_means_off(client):
    def draw(top_k):
        return client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12,
                                         temperature=1.0, seed=7,
                                         extra_body={"top_k": top_k}).choices[0].text

    assert draw(-1) == draw(0)
    with pytest.raises(openai.BadRequestError) as error:
        draw(-2)
    assert error.value.body["param"] == "top_k"


REFUSED_CHAT = [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
      "tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
     "response_format"),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
     "messages.0.content.1"),
    ({"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]},
     "messages.0.content.0"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logit_bias": {"99999999": 5}}, "logit_bias"),
    ({"logit_bias": {"abc": 5}}, "logit_bias"),
    ({"logit_bias": {"12": 101}}, "logit_bias"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"repetition_penalty": 1.2}, "repetition_penalty"),
    ({"min_p": 0.1}, "min_p"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
]


@pytest.mark.parametrize(("extra", "param"), REFUSED_CHAT)
def test_unsupported_chat_parameters_are_refused_by_name(engine, extra, param):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2, **extra}
    response = httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(("extra", "param"), [
    ({"best_of": 2}, "best_of"),
    ({"suffix": "the end"}, "suffix"),
    ({"echo": True, "logprobs": 1}, "echo"),
    ({"logprobs": 21}, "logprobs"),
])
def test_unsupported_completion_parameters_are_refused_by_name(engine, extra, param):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, **extra}
    response = httpx.post(f"{engine.base_url}/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_harmless_values_of_those_parameters_are_accepted(client):
    client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=2, response_format={"type": "text"},
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        tool_choice="none", extra_body={"repetition_penalty": 1.0, "min_p": 0.0})
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, best_of=1, suffix="")


# -- admission: exactly --max-running + --max-waiting, then 429 with Retry-After ----------------


def open_stream(port: int, max_tokens: int = 900) -> socket.socket:
    """A streaming request whose answer is never read (closing the socket abandons it)."""
    sock = connect(port)
    send_request(sock, "POST", "/v1/chat/completions", json.dumps({
        "model": MODEL, "messages": QUESTION, "max_tokens": max_tokens, "ignore_eos": True,
        "stream": True}).encode())
    return sock


def held(engine) -> int:
    """Requests running or waiting, from one scrape (two scrapes straddle admissions)."""
    text = engine.metrics()
    return int(metric_value(text, "vllm:num_requests_running")
               + metric_value(text, "vllm:num_requests_waiting"))


def wait_for(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize(("running", "waiting"), [(2, 1), (2, 0)])
def test_admission_holds_max_running_plus_max_waiting(tmp_path, running, waiting):
    """Streams are admitted up to --max-running + --max-waiting (--max-waiting 0: only as many
    as run), the next one is a 429 with Retry-After, and once the clients leave the engine is
    idle and serves again."""
    engine = start_engine(tmp_path, "--max-model-len", "1024", "--threads", "1",
                          "--max-running", str(running), "--max-waiting", str(waiting))
    socks = []
    try:
        for n in range(1, running + waiting + 1):
            socks.append(open_stream(engine.port))
            wait_for(lambda n=n: held(engine) == n)
        response = httpx.post(f"{engine.base_url}/chat/completions", timeout=30, json={
            "model": MODEL, "messages": QUESTION, "max_tokens": 2})
        assert response.status_code == 429, response.text
        assert response.json()["error"]["code"] == "queue_full"
        assert response.headers["retry-after"] == "1"
        assert held(engine) == running + waiting
        for sock in socks:
            sock.close()
        wait_for(lambda: held(engine) == 0)
        generated = engine.metric("vllm:generation_tokens_total")
        time.sleep(0.5)
        assert engine.metric("vllm:generation_tokens_total") == generated
        response = httpx.post(f"{engine.base_url}/chat/completions", timeout=30, json={
            "model": MODEL, "messages": QUESTION, "max_tokens": 2})
        assert response.status_code == 200
    finally:
        for sock in socks:
            sock.close()
        stop_engine(engine)


def test_clients_that_come_straight_back_at_capacity_are_not_refused(tmp_path):
    """As many streams as the engine runs, each sending its next request as soon as its last
    one ends: none is refused (a finished sequence's place counts as free while its
    successor's prompt waits for the step's token budget)."""
    engine = start_engine(tmp_path, "--max-model-len", "512", "--threads", "1",
                          "--max-running", "3", "--max-waiting", "0",
                          "--max-batch-tokens", "16")
    statuses: list[int] = []
    try:
        def client():
            for _ in range(4):
                statuses.append(httpx.post(f"{engine.base_url}/chat/completions", timeout=60,
                                           json={"model": MODEL, "messages": QUESTION,
                                                 "max_tokens": 4, "ignore_eos": True}
                                           ).status_code)

        threads = [threading.Thread(target=client) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert statuses == [200] * 12
    finally:
        stop_engine(engine)


# -- SIGTERM: drain ------------------------------------------------------------------------------


def stream_lines(port: int, body: dict, lines: list[str], started: threading.Event) -> None:
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body,
                      timeout=120) as response:
        for line in response.iter_lines():
            if line:
                lines.append(line)
                started.set()


def final_reason(lines: list[str]) -> tuple[str | None, int]:
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    return reasons[-1], sum(1 for r in reasons if r is None)


def test_sigterm_lets_a_long_stream_finish(tmp_path):
    engine = start_engine(tmp_path, "--max-model-len", "4096", "--drain-seconds", "90")
    try:
        lines: list[str] = []
        started = threading.Event()
        # Far longer than uvicorn's own 5 s grace, well inside the 90 s drain even on a busy
        # shared core (3000 tokens took over 90 s there once).
        body = {"model": MODEL, "prompt": "Go on:", "max_tokens": 1500, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        reader = threading.Thread(target=stream_lines, args=(engine.port, body, lines, started))
        reader.start()
        assert started.wait(60)
        engine.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        # No longer admitting: a new request is refused (connection refused, or a 503).
        try:
            refused = httpx.post(f"{engine.base_url}/completions", timeout=10, json={
                "model": MODEL, "prompt": "Hi", "max_tokens": 2})
            assert refused.status_code == 503
        except httpx.ConnectError:
            pass
        reader.join(120)
        assert lines[-1] == "data: [DONE]"
        usage = json.loads(lines[-2][6:])["usage"]
        assert usage["completion_tokens"] == 1500
        assert final_reason(lines[:-1])[0] == "length"
        assert engine.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
    finally:
        stop_engine(engine)


def test_sigterm_past_the_grace_ends_streams_with_a_final_chunk(tmp_path):
    engine = start_engine(tmp_path, "--max-model-len", "4096", "--drain-seconds", "1")
    try:
        streams = [([], threading.Event()) for _ in range(2)]
        readers = [threading.Thread(target=stream_lines, args=(engine.port, {
            "model": MODEL, "prompt": f"Story {i}:", "max_tokens": 4000, "ignore_eos": True,
            "stream": True}, lines, started)) for i, (lines, started) in enumerate(streams)]
        for r in readers:
            r.start()
        for _, started in streams:
            assert started.wait(60)
        engine.proc.send_signal(signal.SIGTERM)
        for r in readers:
            r.join(60)
        for lines, _ in streams:
            assert lines[-1] == "data: [DONE]"
            reason, tokens = final_reason(lines[:-1])
            assert reason == "abort" and 0 < tokens < 4000
        assert engine.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
        assert "draining" in engine.log.read_text()
    finally:
        stop_engine(engine)


# -- newcomer friction ---------------------------------------------------------------------------


def test_help_shows_defaults_threads_and_port():
    out = subprocess.run([sys.executable, "-m", "heteroserve_engines.cpu_engine", "--help"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "--threads" in out and "--drain-seconds" in out and "--max-body-bytes" in out
    assert "(default: 8010)" in " ".join(out.split())
    assert "(default: 256)" in " ".join(out.split())  # --max-waiting


def test_threads_flag_sets_the_pool(small):
    assert "on 1 threads" in small.log.read_text()
