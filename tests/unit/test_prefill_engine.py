"""The prefill engine's scheduler with the real SmolLM2 model on the CPU device: batched prefill
and decode against one request at a time, preemption when the KV budget is full, KV kept for a
remote decode until released, aborts, stops and seeded sampling."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from heteroserve_engines.cpu_engine.__main__ import default_model
from heteroserve_engines.cpu_engine.runner import PromptTooLong, QueueFull, SamplingParams
from heteroserve_engines.cpu_engine.tokenizer import GGUFTokenizer
from heteroserve_engines.prefill.engine import PrefillEngine
from heteroserve_engines.prefill.model import LlamaModel


@pytest.fixture(scope="module")
def loaded():
    model, reader = LlamaModel.from_gguf(default_model(), torch.device("cpu"), torch.float32)
    return model, GGUFTokenizer.from_gguf(reader)


def make_engine(loaded, budget: int = 1024, **kwargs) -> PrefillEngine:
    model, tok = loaded
    return PrefillEngine(model, model.new_pool(budget), tok,
                         **{"max_model_len": 256, **kwargs})


def run_to_end(engine: PrefillEngine, prompts: list[list[int]], params: SamplingParams,
               keep_kv: bool = False):
    outputs = {i: [] for i in range(len(prompts))}
    done = {i: threading.Event() for i in range(len(prompts))}
    seqs = []
    for i, prompt in enumerate(prompts):
        def emit(delta, i=i):
            outputs[i].append(delta)
            if delta.finish_reason:
                done[i].set()
        seqs.append(engine.add(prompt, params, emit, keep_kv=keep_kv))
    for _ in range(1000):
        if all(e.is_set() for e in done.values()):
            break
        engine.step()
    return seqs, outputs


def test_batched_prompts_and_decodes_match_one_at_a_time(loaded):
    _, tok = loaded
    prompts = [tok.encode("The history of the Roman empire"), tok.encode("def add(a, b):"),
               tok.encode("1, 2, 3,")]
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    alone = []
    for prompt in prompts:
        (seq,), _ = run_to_end(make_engine(loaded), [prompt], params)
        alone.append(seq.output_ids)
    engine = make_engine(loaded)
    seqs, outputs = run_to_end(engine, prompts, params)
    assert [s.output_ids for s in seqs] == alone
    assert all(len(ids) == 10 for ids in alone)
    assert all(o[-1].finish_reason == "length" for o in outputs.values())
    assert engine.pool.usage == 0.0  # every block back
    assert engine.stats.prompt_tokens == sum(map(len, prompts))
    assert engine.stats.generated_tokens == 30


def test_a_full_budget_preempts_and_recomputes(loaded):
    _, tok = loaded
    prompt = tok.encode("A list of fruits: apple, banana,")
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    (reference,), _ = run_to_end(make_engine(loaded), [prompt], params)
    # 6 blocks of 16 tokens cannot hold three sequences of ~50 tokens at once.
    small = make_engine(loaded, budget=96, max_model_len=96)
    seqs, _ = run_to_end(small, [prompt] * 3, params)
    assert all(s.output_ids == reference.output_ids for s in seqs)
    assert small.stats.preemptions > 0
    assert small.pool.usage == 0.0


def test_a_remote_decode_prefill_keeps_the_prompts_kv_until_released(loaded):
    _, tok = loaded
    prompt = tok.encode("The capital of France is")
    engine = make_engine(loaded)
    (seq,), outputs = run_to_end(engine, [prompt], SamplingParams(max_tokens=50, temperature=0),
                                 keep_kv=True)
    assert seq.finish_reason == "length" and len(seq.output_ids) == 1  # one token, then done
    assert outputs[0][-1].completion_tokens == 1
    kept = engine.kept[seq.id]
    assert kept.token_ids == prompt
    assert len(kept.blocks) == engine.pool.blocks_for(len(prompt))
    assert engine.pool.usage > 0
    k_rows, v_rows = engine.read_kv(seq.id, 0)
    width = engine.model.config.n_head_kv * engine.model.config.head_dim
    assert len(k_rows) == len(v_rows) == len(prompt) * width * 2
    assert np.isfinite(np.frombuffer(k_rows, "<f2")).all()
    engine.release_kv(seq.id)
    engine.step()
    assert seq.id not in engine.kept and engine.pool.usage == 0.0


def test_aborts_free_running_and_waiting_sequences(loaded):
    _, tok = loaded
    engine = make_engine(loaded, max_num_seqs=1)
    params = SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)
    first = engine.add(tok.encode("Once upon a time"), params, lambda d: None)
    second = engine.add(tok.encode("Twice upon a time"), params, lambda d: None)
    engine.step()
    assert engine.running == [first] and list(engine.waiting) == [second]
    engine.abort(first.id)
    engine.abort(second.id)
    engine.step()
    assert not engine.running and not engine.waiting and engine.pool.usage == 0.0


def test_stop_strings_are_cut_and_never_streamed(loaded):
    _, tok = loaded
    engine = make_engine(loaded)
    prompt = tok.encode("1, 2, 3, 4,")
    (free,), _ = run_to_end(engine, [prompt], SamplingParams(max_tokens=12, temperature=0))
    assert " 6" in free.text
    (stopped,), outputs = run_to_end(engine, [prompt],
                                     SamplingParams(max_tokens=12, temperature=0, stop=[" 6"]))
    streamed = "".join(d.text for d in outputs[0])
    assert stopped.finish_reason == "stop"
    assert streamed == stopped.text == free.text[: free.text.index(" 6")]


def test_seeded_sampling_is_reproducible_and_top_k_one_is_greedy(loaded):
    _, tok = loaded
    engine = make_engine(loaded)
    prompt = tok.encode("Once upon a time")
    sample = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=5, ignore_eos=True)
    (a,), _ = run_to_end(engine, [prompt], sample)
    (b,), _ = run_to_end(engine, [prompt], sample)
    assert a.output_ids == b.output_ids
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    (g,), _ = run_to_end(engine, [prompt], greedy)
    top1 = SamplingParams(max_tokens=10, temperature=1.0, top_k=1, seed=1, ignore_eos=True)
    (t,), _ = run_to_end(engine, [prompt], top1)
    assert t.output_ids == g.output_ids


def test_limits(loaded):
    engine = make_engine(loaded, max_model_len=32, max_waiting=1)
    with pytest.raises(PromptTooLong, match="maximum context length is 32"):
        engine.add(list(range(100, 140)), SamplingParams(), lambda d: None)
    with pytest.raises(PromptTooLong, match="empty"):
        engine.add([], SamplingParams(), lambda d: None)
    engine.add([1, 2, 3], SamplingParams(), lambda d: None)
    with pytest.raises(QueueFull):
        engine.add([1, 2, 3], SamplingParams(), lambda d: None)
    model, tok = loaded
    with pytest.raises(ValueError, match="KV budget"):
        PrefillEngine(model, model.new_pool(64), tok, max_model_len=256)
