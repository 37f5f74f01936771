"""The KV hand-off between real engine processes on loopback (docs/kv-handoff.md): an exporting
engine keeps a prompt's KV under a handle, the CPU engine pulls it and continues without
computing the prompt, and through the router the `split` policy does both. Here the exporter is
a second CPU engine (the same weights and kernels: its KV is the one the decode engine would
have computed itself); the builtin PyTorch prefill engine is the exporter in
test_prefill_engine.py. Both run the batch-invariant vector variant (tests/variants.py): the
decoder computes a handed-over prompt's last token in a step of its own, where alone it computes
it inside the prompt's chunk, which amx runs on the tile unit (bf16) - another batch shape."""

from __future__ import annotations

import http.server
import secrets
import threading

import httpx
import pytest

from tests.e2e.conftest import start_engine, stop_engine
from tests.e2e.routers import start_router, stop_router, wait_until
from tests.e2e.test_router import MESSAGES, MODEL, ONE_CORE, client_for
from tests.variants import BATCH_INVARIANT

PROMPTS = [f"Tell me one fact about the number {n}." for n in range(50)]


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("kv") / "kv-token"
    path.write_text(secrets.token_urlsafe(24))
    return path


@pytest.fixture(scope="module")
def other_model(tmp_path_factory):
    """Another model that the CPU engine serves: small random weights, SmolLM2's tokenizer."""
    from gguf import GGMLQuantizationType

    from tests.bench.cpu_engine_vs_llamacpp import tokenizer_fields
    from tests.reference.synthetic import write_llama

    fields = tokenizer_fields(None)
    return write_llama(tmp_path_factory.mktemp("other") / "other.gguf", n_layer=2, n_embd=128,
                       n_head=4, n_kv=2, n_ff=256, vocab=len(fields["tokenizer.ggml.tokens"]),
                       qtype=GGMLQuantizationType.Q8_0, tokenizer=fields)


@pytest.fixture(scope="module")
def exporter(tmp_path_factory, token_file):
    engine = start_engine(tmp_path_factory.mktemp("exporter"), "--max-model-len", "512",
                          "--kv-token-file", str(token_file), "--kv-handle-timeout", "2",
                          "--kernels", BATCH_INVARIANT, env=ONE_CORE[0])
    yield engine
    stop_engine(engine)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory, token_file):
    engine = start_engine(tmp_path_factory.mktemp("decoder"), "--max-model-len", "512",
                          "--kv-token-file", str(token_file), "--kernels", BATCH_INVARIANT,
                          env=ONE_CORE[1])
    yield engine
    stop_engine(engine)


def chat(engine_url: str, content: str, max_tokens: int = 32, **extra) -> httpx.Response:
    return httpx.post(engine_url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "temperature": 0, **extra})


def url(engine) -> str:
    return f"http://127.0.0.1:{engine.port}"


def prefill(exporter, content: str) -> dict:
    answer = chat(url(exporter), content, 1, kv_transfer_params={"do_remote_decode": True})
    assert answer.status_code == 200, answer.text
    params = answer.json()["kv_transfer_params"]
    assert params["do_remote_prefill"] and params["remote_handle"]
    return {**params, "remote_host": "127.0.0.1"}


def test_decode_continues_from_pulled_kv_without_computing_the_prompt(exporter, decoder):
    alone = chat(url(decoder), MESSAGES[0]["content"]).json()
    before = decoder.metric("heteroserve:kv_imported_tokens_total")
    prompt_before = decoder.metric("vllm:prompt_tokens_total")
    params = prefill(exporter, MESSAGES[0]["content"])
    handed = chat(url(decoder), MESSAGES[0]["content"], kv_transfer_params=params)
    assert handed.status_code == 200, handed.text
    assert handed.json()["choices"][0]["message"]["content"] == \
        alone["choices"][0]["message"]["content"]
    imported = decoder.metric("heteroserve:kv_imported_tokens_total") - before
    prompt = alone["usage"]["prompt_tokens"]
    assert imported == prompt - 1  # the last prompt token is computed here, for its logits
    assert decoder.metric("vllm:prompt_tokens_total") - prompt_before == 1
    # Pulled once, then freed: the exporter's cache is empty and the handle is gone.
    wait_until(lambda: exporter.metric("vllm:kv_cache_usage_perc") == 0, 5,
               lambda: "the exporter kept the KV after its pull")
    again = chat(url(decoder), MESSAGES[0]["content"], kv_transfer_params=params)
    assert again.status_code == 502 and again.json()["error"]["code"] == "kv_pull_refused"


def test_pull_needs_the_token_and_the_handle_expires(exporter, token_file):
    params = prefill(exporter, "Hello there")
    kv_url = f"{url(exporter)}/v1/kv/{params['remote_handle']}"
    for headers in ({}, {"authorization": "Bearer not-the-token"}):
        refused = httpx.get(kv_url, headers=headers)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "kv_forbidden"
    assert exporter.metric("vllm:kv_cache_usage_perc") > 0
    # --kv-handle-timeout 2: unpulled, the KV is freed and the handle answers 404.
    wait_until(lambda: exporter.metric("vllm:kv_cache_usage_perc") == 0, 6,
               lambda: "the unpulled KV was never freed")
    gone = httpx.get(kv_url, headers={"authorization": "Bearer " + token_file.read_text()})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "kv_handle_not_found"


def test_concurrent_hand_offs_never_read_each_others_kv(exporter, decoder):
    contents = ["Name a fruit.", "Explain rain in one sentence."]
    alone = [chat(url(decoder), c).json()["choices"][0]["message"]["content"]
             for c in contents]
    params = [prefill(exporter, c) for c in contents]  # both kept at once
    results: dict[int, str] = {}

    def decode(index: int) -> None:
        answer = chat(url(decoder), contents[index], kv_transfer_params=params[index])
        results[index] = answer.json()["choices"][0]["message"]["content"]

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [results[0], results[1]] == alone


class _Serve(http.server.BaseHTTPRequestHandler):
    payload = b""

    def do_GET(self):  # the http.server interface
        self.send_response(200)
        self.send_header("content-type", "application/x-heteroserve-kv")
        self.send_header("content-length", str(len(self.payload)))
        self.end_headers()
        self.wfile.write(self.payload)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_damaged_stream_is_refused_before_anything_is_imported(damage, exporter, decoder,
                                                                 token_file):
    params = prefill(exporter, MESSAGES[0]["content"])
    raw = httpx.get(f"{url(exporter)}/v1/kv/{params['remote_handle']}", headers={
        "authorization": "Bearer " + token_file.read_text()}).content
    raw = (raw[:1000] + bytes([raw[1000] ^ 0xFF]) + raw[1001:] if damage == "flipped byte"
           else raw[: len(raw) // 2])
    handler = type("Damaged", (_Serve,), {"payload": raw})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        before = decoder.metric("heteroserve:kv_imported_tokens_total")
        answer = chat(url(decoder), MESSAGES[0]["content"], kv_transfer_params={
            **params, "remote_port": server.server_address[1]})
        assert answer.status_code == 502
        assert answer.json()["error"]["code"] == "kv_stream_invalid"
        assert decoder.metric("heteroserve:kv_imported_tokens_total") == before
    finally:
        server.shutdown()


def test_another_models_kv_is_refused(tmp_path, exporter, token_file, other_model):
    engine = start_engine(tmp_path, "--model", str(other_model), "--served-model-name", MODEL,
                          "--kv-token-file", str(token_file), env=ONE_CORE[1])
    try:
        params = prefill(exporter, "Hello")
        answer = httpx.post(url(engine) + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2, "kv_transfer_params": params})
        assert answer.status_code == 409
        assert answer.json()["error"]["code"] == "kv_model_mismatch"
    finally:
        stop_engine(engine)


# -- through the router --------------------------------------------------------------------------

@pytest.fixture
def split_router(tmp_path, exporter, decoder):
    router = start_router(tmp_path, {
        "model": MODEL, "policy": "split",
        "accelerator": {"urls": [url(exporter)], "kvExport": True},
        "cpu": {"urls": [url(decoder)], "kvImport": True}})
    yield router
    stop_router(router)


def test_split_through_the_router_agrees_with_the_cpu_engine_alone(split_router, decoder):
    client = client_for(split_router)
    before = decoder.metric("heteroserve:kv_imported_tokens_total")
    agree = 0
    for content in PROMPTS:
        alone = chat(url(decoder), content).json()["choices"][0]["message"]["content"]
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=32,
            temperature=0)
        assert raw.headers["x-heteroserve-tier"] == "cpu"
        agree += raw.parse().choices[0].message.content == alone
    assert agree == len(PROMPTS)  # the same weights and kernels on both sides: exact
    assert split_router.metric("heteroserve_router_kv_handoffs_total", outcome="ok") == 50
    assert decoder.metric("heteroserve:kv_imported_tokens_total") > before


def test_split_streams_and_falls_back_when_the_decode_refuses_the_kv(tmp_path, exporter,
                                                                    token_file, other_model):
    mismatched = start_engine(tmp_path, "--model", str(other_model), "--served-model-name", MODEL,
                              "--kv-token-file", str(token_file), env=ONE_CORE[1])
    try:
        router = start_router(tmp_path, {
            "model": MODEL, "policy": "split",
            "accelerator": {"urls": [url(exporter)], "kvExport": True},
            "cpu": {"urls": [url(mismatched)], "kvImport": True}})
        try:
            stream = client_for(router).completions.create(
                model=MODEL, prompt="Hello", max_tokens=4, stream=True)
            assert "".join(c.choices[0].text for c in stream) is not None
            assert router.metric("heteroserve_router_kv_handoffs_total",
                                 outcome="decode_refused") == 1
            assert router.metric("heteroserve_router_requests_total", outcome="success") == 1
        finally:
            stop_router(router)
    finally:
        stop_engine(mismatched)


def test_prefill_engine_dying_after_its_first_token(tmp_path, decoder, token_file):
    """The handle outlives its engine: the decode engine's pull fails cleanly (and the router,
    as with any refused KV, has the CPU compute the prompt)."""
    doomed = start_engine(tmp_path, "--max-model-len", "512", "--kv-token-file",
                          str(token_file), env=ONE_CORE[0])
    try:
        params = prefill(doomed, MESSAGES[0]["content"])
    finally:
        doomed.proc.kill()
        doomed.proc.wait()
    answer = chat(url(decoder), MESSAGES[0]["content"], kv_transfer_params=params)
    assert answer.status_code == 502 and answer.json()["error"]["code"] == "kv_pull_failed"
