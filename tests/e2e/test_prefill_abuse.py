"""The builtin prefill engine refuses what it does not do the way the CPU engine does (issue
14): malformed bodies and unsupported parameters are OpenAI-shaped 400s naming the parameter,
and vLLM's `top_k: -1` means off. A real `heteroserve-prefill-engine` process (torch on CPU)."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.test_engine_abuse import QUESTION, REFUSED_CHAT, SURROGATE_BODIES
from tests.e2e.test_prefill_engine import MODEL, start_prefill
from tests.processes import stop_process


@pytest.fixture(scope="module")
def prefill(tmp_path_factory):
    process = start_prefill(tmp_path_factory.mktemp("prefill-abuse"))
    try:
        yield process
    finally:
        stop_process(process.proc)


def post(engine, path: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{engine.base_url}/{path}", timeout=60, **kwargs)


def test_malformed_bodies_are_400s(prefill):
    for body in [*SURROGATE_BODIES, b"[" * 100_000 + b"]" * 100_000]:
        response = post(prefill, "chat/completions", content=body,
                        headers={"content-type": "application/json"})
        assert response.status_code == 400, response.text
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


# The CPU engine refuses these too, except that it samples with the last four.
PREFILL_ONLY = [({"logprobs": True}, "logprobs"), ({"frequency_penalty": 0.5}, "frequency_penalty"),
                ({"presence_penalty": -1.0}, "presence_penalty"),
                ({"logit_bias": {"5": 3}}, "logit_bias")]


@pytest.mark.parametrize(("extra", "param"), REFUSED_CHAT + PREFILL_ONLY)
def test_unsupported_parameters_are_refused_by_name(prefill, extra, param):
    response = post(prefill, "chat/completions",
                    json={"model": MODEL, "messages": QUESTION, "max_tokens": 2, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(("extra", "param"), [
    ({"best_of": 3}, "best_of"), ({"suffix": "x"}, "suffix"), ({"logprobs": 2}, "logprobs")])
def test_unsupported_completion_parameters_are_refused_by_name(prefill, extra, param):
    response = post(prefill, "completions",
                    json={"model": MODEL, "prompt": "Hi", "max_tokens": 2, **extra})
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_top_k_minus_one_is_off(prefill):
    def draw(top_k):
        return post(prefill, "completions", json={
            "model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0,
            "seed": 3, "top_k": top_k}).json()["choices"][0]["text"]

    assert draw(-1) == draw(0)
