"""The split path with the builtin prefill engine: through the router's `split` policy the
PyTorch prefill engine (a process on the CPU device, as in CI) computes each prompt and exports
its KV, the CPU engine pulls it and decodes; chat prompts at temperature 0 against the CPU
engine alone, the first 32 tokens, with each `--activation-quantization` setting.

With `avx512vnni` the prefill engine repeats the CPU engine's avx512vnni arithmetic bit for bit
(prefill/exact.py) and the decoder runs those kernels: the split's 32 tokens are the CPU engine
alone's on every one of the 50 prompts (asserted: bit-identical KV leaves no room for one to
differ; 50 of 50 also with tests.bench.split_agreement, on the VM and from CUDA on the H100).

With float arithmetic (`none`, `q8`) they are not, and cannot be. Measured (2-core VM, CPU
engine on its best kernels, amx; this test and an in-process harness agree): the split gives
the CPU engine alone's 32 tokens on 13/50 prompts with `q8`, 15/50 with `none` - and a second
CPU engine on another of its kernel variants as the exporter does no better: 14/50
(avx512vnni), 15/50 (reference); the CPU engine on two of its variants, without a hand-off,
agrees on 12-14/50. The first token agrees on 40-48/50. Every divergence starts at a near-tie
of the CPU engine's own logits (at most 0.6 logits apart, median 0.08): its 8-bit activation
quantization turns any float rounding difference (a summation order, an exp) into whole
quantization steps within a layer or two, so K/V computed by any other arithmetic differ from
the decoder's own by its quantization noise (~0.8 logits at the first token), and SmolLM2's
chat answers are full of near-ties. So for those modes this asserts the hand-offs themselves, a
rate well above what a wrong KV gives (a wrong layout or RoPE convention is off by 15-20 logits:
no prompt agrees) and answers that mostly start alike, and prints the rates."""

from __future__ import annotations

import secrets
import time

import httpx
import pytest

from tests.e2e.conftest import start_engine, stop_engine
from tests.e2e.routers import start_router, stop_router
from tests.e2e.test_prefill_engine import start_prefill
from tests.e2e.test_router import MODEL, ONE_CORE, client_for
from tests.processes import stop_process
from tests.variants import EXACT_HANDOFF_SKIP

PROMPTS = [f"Tell me one fact about the number {n}." for n in range(0, 50, 2)] + [
    "Name three colors.", "What is the capital of France?", "Explain rain in one sentence.",
    "Write a haiku about the sea.", "What is photosynthesis?", "Give me a synonym for happy.",
    "How many legs does a spider have?", "Who wrote Romeo and Juliet?",
    "What is 12 times 7?", "Suggest a name for a pet cat.", "Why is the sky blue?",
    "What does a computer's CPU do?", "Describe a sunset in two sentences.",
    "List three fruits that are red.", "What is the boiling point of water?",
    "Translate 'good morning' into Spanish.", "What is a prime number?",
    "Give one tip for learning to code.", "What do bees make?",
    "Write a short greeting for a birthday card.", "What is the largest ocean?",
    "How do plants drink water?", "Name a famous painter.", "What is gravity?",
    "Tell me a fun fact about cats.",
]
MAX_TOKENS = 32
MIN_AGREEMENT = 0.1  # see the module docstring: ~0.3 measured, 0 for a wrong KV
MIN_SHARED_START = 0.6  # prompts whose two answers share their first 8 characters


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("kv") / "kv-token"
    path.write_text(secrets.token_urlsafe(24))
    return path


@pytest.fixture(scope="module", params=["none", "q8"])
def prefill(request, tmp_path_factory, token_file):
    engine = start_prefill(tmp_path_factory.mktemp("prefill"), "--kv-token-file",
                           str(token_file), "--activation-quantization", request.param,
                           env=ONE_CORE[0])
    engine.activation_quantization = request.param
    yield engine
    stop_process(engine.proc)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory, token_file):
    engine = start_engine(tmp_path_factory.mktemp("decoder"), "--max-model-len", "512",
                          "--kv-token-file", str(token_file), env=ONE_CORE[1])
    yield engine
    stop_engine(engine)


def answers_alone(decoder, prompts: list[str]) -> list[str]:
    """The CPU engine alone's answers (the prompt computed there)."""
    answers = []
    for content in prompts:
        answer = httpx.post(f"http://127.0.0.1:{decoder.port}/v1/chat/completions",
                            timeout=120, json={
                                "model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0,
                                "messages": [{"role": "user", "content": content}]})
        assert answer.status_code == 200, answer.text
        answers.append(answer.json()["choices"][0]["message"]["content"])
    return answers


def answers_split(client, prompts: list[str]) -> list[str]:
    """The answers through the router's split (each one served by the CPU tier)."""
    answers = []
    for content in prompts:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": content}],
            max_tokens=MAX_TOKENS, temperature=0)
        assert raw.headers["x-heteroserve-tier"] == "cpu"
        answers.append(raw.parse().choices[0].message.content)
    return answers


@pytest.fixture(scope="module")
def alone(decoder) -> list[str]:
    return answers_alone(decoder, PROMPTS)


@pytest.fixture
def split_router(tmp_path, prefill, decoder):
    router = start_router(tmp_path, {
        "model": MODEL, "policy": "split",
        "accelerator": {"urls": [f"http://127.0.0.1:{prefill.port}"], "kvExport": True},
        "cpu": {"urls": [f"http://127.0.0.1:{decoder.port}"], "kvImport": True}})
    yield router
    stop_router(router)


def test_split_with_the_builtin_prefill_engine_against_the_cpu_engine_alone(
        split_router, prefill, decoder, alone):
    client = client_for(split_router)
    imported = decoder.metric("heteroserve:kv_imported_tokens_total")
    agree = shared_start = 0
    started = time.monotonic()
    for split, expected in zip(answers_split(client, PROMPTS), alone, strict=True):
        agree += split == expected
        shared_start += split[:8] == expected[:8]
    rate = agree / len(PROMPTS)
    print(f"\nsplit (builtin prefill on cpu, --activation-quantization "
          f"{prefill.activation_quantization}) vs the CPU engine alone, first {MAX_TOKENS} "
          f"greedy tokens: {agree}/{len(PROMPTS)} = {rate:.0%} agree, {shared_start}/"
          f"{len(PROMPTS)} start with the same 8 characters ({time.monotonic() - started:.0f} s)")
    assert split_router.metric("heteroserve_router_kv_handoffs_total", outcome="ok") == 50
    assert decoder.metric("heteroserve:kv_imported_tokens_total") > imported
    assert rate >= MIN_AGREEMENT
    assert shared_start / len(PROMPTS) >= MIN_SHARED_START


EXACT_PROMPTS = PROMPTS  # all 50: the exact prefill takes ~1 s each on one core


@pytest.fixture(scope="module")
def exact_pair(tmp_path_factory, token_file):
    """The prefill engine on the CPU engine's avx512vnni arithmetic, and a decoder on those
    kernels."""
    prefill = start_prefill(tmp_path_factory.mktemp("exact-prefill"), "--kv-token-file",
                            str(token_file), "--activation-quantization", "avx512vnni",
                            env=ONE_CORE[0])
    try:
        decoder = start_engine(tmp_path_factory.mktemp("exact-decoder"), "--max-model-len",
                               "512", "--kv-token-file", str(token_file), "--kernels",
                               "avx512vnni", env=ONE_CORE[1])
    except BaseException:  # a decoder that does not start leaves no prefill engine running
        stop_process(prefill.proc)
        raise
    yield prefill, decoder
    stop_engine(decoder)
    stop_process(prefill.proc)


@pytest.mark.skipif(EXACT_HANDOFF_SKIP,
                    reason="the exact hand-off decodes on the CPU engine's avx512vnni kernels, "
                           "which this CPU lacks (the engine refuses `--kernels avx512vnni`)")
def test_split_with_exact_numerics_gives_the_cpu_engine_alones_tokens(tmp_path, exact_pair):
    prefill, decoder = exact_pair
    alone = answers_alone(decoder, EXACT_PROMPTS)
    router = start_router(tmp_path, {
        "model": MODEL, "policy": "split",
        "accelerator": {"urls": [f"http://127.0.0.1:{prefill.port}"], "kvExport": True},
        "cpu": {"urls": [f"http://127.0.0.1:{decoder.port}"], "kvImport": True}})
    try:
        client = client_for(router)
        imported = decoder.metric("heteroserve:kv_imported_tokens_total")
        differing = [(content, expected, split) for content, expected, split in zip(
            EXACT_PROMPTS, alone, answers_split(client, EXACT_PROMPTS), strict=True)
            if split != expected]
        handoffs = router.metric("heteroserve_router_kv_handoffs_total", outcome="ok")
    finally:
        stop_router(router)
    print(f"\nsplit (builtin prefill on cpu, --activation-quantization avx512vnni, decoder "
          f"--kernels avx512vnni) vs the CPU engine alone: "
          f"{len(EXACT_PROMPTS) - len(differing)}/{len(EXACT_PROMPTS)} equal")
    assert handoffs == len(EXACT_PROMPTS)
    assert decoder.metric("heteroserve:kv_imported_tokens_total") > imported
    assert not differing, differing
