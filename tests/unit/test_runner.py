"""The engine core's scheduling with the real SmolLM2 model: chunked prefill, continuous
batching, KV block accounting, preemption when the cache is full, stop handling."""

from __future__ import annotations

import threading
from collections import deque

import heteroserve_cpu as hc
import numpy as np
import pytest

from heteroserve_engines.cpu_engine.__main__ import default_model
from heteroserve_engines.cpu_engine.gguf_model import load_model
from heteroserve_engines.cpu_engine.runner import EngineCore, PromptTooLong, SamplingParams
from heteroserve_engines.cpu_engine.tokenizer import GGUFTokenizer
from tests.variants import BATCH_INVARIANT


@pytest.fixture(scope="module")
def model_and_tokenizer():  # outputs compared across batch shapes: see tests/variants.py
    model, config, reader = load_model(default_model(), hc.Pool([], 2), kernels=BATCH_INVARIANT)
    model.alloc_kv(64, 16)
    return model, config, GGUFTokenizer.from_gguf(reader)


def run_to_end(core: EngineCore, prompts: list[list[int]], params: SamplingParams):
    outputs = {i: [] for i in range(len(prompts))}
    done = {i: threading.Event() for i in range(len(prompts))}
    seqs = []
    for i, prompt in enumerate(prompts):
        def emit(delta, i=i):
            outputs[i].append(delta)
            if delta.finish_reason:
                done[i].set()
        seqs.append(core.add(prompt, params, emit))
    for _ in range(2000):
        if all(e.is_set() for e in done.values()):
            break
        core.step()
    return seqs, outputs


def test_chunked_prefill_and_batching_match_one_at_a_time(model_and_tokenizer):
    model, config, tok = model_and_tokenizer
    prompts = [tok.encode("The history of the Roman empire"), tok.encode("def add(a, b):")]
    params = SamplingParams(max_tokens=12, temperature=0)
    alone = []
    for prompt in prompts:
        core = EngineCore(model, tok, config.n_vocab, n_blocks=64, max_model_len=256)
        seqs, _ = run_to_end(core, [prompt], params)
        alone.append(seqs[0].output_ids)
    # Small token budget: prefill is split into chunks of 4 and batched with decodes.
    batches: list[float] = []  # sequences that got a token, per step

    def observe(name: str, value: float) -> None:
        if name == "decode_batch":
            batches.append(value)

    core = EngineCore(model, tok, config.n_vocab, n_blocks=64, max_model_len=256,
                      max_batch_tokens=4, observe=observe)
    seqs, outputs = run_to_end(core, prompts, params)
    assert [s.output_ids for s in seqs] == alone
    assert max(batches) == 2  # both sequences got their tokens from one forward pass
    assert all(o[-1].finish_reason == "length" for o in outputs.values())
    assert core.allocator.usage == 0.0  # every block back


def test_full_cache_preempts_and_recomputes(model_and_tokenizer):
    model, config, tok = model_and_tokenizer
    prompt = tok.encode("A list of fruits: apple, banana,")
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    core = EngineCore(model, tok, config.n_vocab, n_blocks=64, max_model_len=256)
    (reference,), _ = run_to_end(core, [prompt], params)
    # 6 blocks of 16 tokens cannot hold three sequences of ~50 tokens at once.
    small = EngineCore(model, tok, config.n_vocab, n_blocks=6, max_model_len=256)
    seqs, _ = run_to_end(small, [prompt] * 3, params)
    assert small.stats.preemptions > 0
    assert all(s.output_ids == reference.output_ids for s in seqs)
    assert small.allocator.usage == 0.0
    assert reference.finish_reason == "length" and all(s.finish_reason == "length" for s in seqs)


class WatchedLock:
    """The engine's lock, checking the moments another thread could take it (before each
    acquire, after each release): every unfinished sequence it has seen is then in exactly one
    of `waiting` and `running`, as `load` (the running and waiting gauges) relies on. It also
    puts guards on the two lists that record any change made without the lock held (a move done
    outside the lock altogether has no lock boundary in the middle for the check to see)."""

    def __init__(self, core: EngineCore):
        self.core, self.inner = core, threading.Condition()
        self.seen: dict[int, object] = {}
        self.checks, self.violations, self.unlocked = 0, [], []
        self.depth = 0
        core.waiting = guarded(self, deque, core.waiting)
        core.running = guarded(self, list, core.running)

    def check(self) -> None:
        core = self.core
        for seq in [*core.waiting, *core.running]:
            self.seen[seq.id] = seq
        self.checks += 1
        for seq in self.seen.values():
            places = (seq in core.waiting) + (seq in core.running)
            if seq.finish_reason is None and places != 1:
                self.violations.append((seq.id, places))

    def __enter__(self):
        self.check()
        entered = self.inner.__enter__()
        self.depth += 1
        return entered

    def __exit__(self, *exc):
        self.depth -= 1
        result = self.inner.__exit__(*exc)
        self.check()
        return result

    def notify(self) -> None:
        self.inner.notify()


def guarded(lock: WatchedLock, kind: type, items):
    """`kind` (list or deque) whose changes are recorded in lock.unlocked when made unlocked."""
    class GuardedList(kind):
        def _note(self, name):
            if lock.depth == 0:
                lock.unlocked.append(name)

    for name in ("append", "appendleft", "popleft", "pop", "remove", "insert", "clear"):
        if hasattr(kind, name):
            def method(self, *args, _name=name):
                self._note(_name)
                return getattr(kind, _name)(self, *args)
            setattr(GuardedList, name, method)
    return GuardedList(items)


def test_admission_and_preemption_move_a_sequence_in_one_locked_step(model_and_tokenizer):
    model, config, tok = model_and_tokenizer
    prompt = tok.encode("A list of fruits: apple, banana,")
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    # 6 blocks of 16 tokens for three sequences of ~50 tokens: admissions and preemptions.
    core = EngineCore(model, tok, config.n_vocab, n_blocks=6, max_model_len=256)
    core._lock = watched = WatchedLock(core)
    seqs, _ = run_to_end(core, [prompt] * 3, params)
    assert all(s.finish_reason == "length" for s in seqs)
    assert core.stats.preemptions > 0 and len(watched.seen) == 3 and watched.checks > 100
    assert watched.violations == [] and watched.unlocked == []
    assert core.load() == (0, 0)


def test_stop_strings_are_cut_and_never_streamed(model_and_tokenizer):
    model, config, tok = model_and_tokenizer
    core = EngineCore(model, tok, config.n_vocab, n_blocks=64, max_model_len=256)
    prompt = tok.encode("1, 2, 3, 4,")
    (free,), _ = run_to_end(core, [prompt], SamplingParams(max_tokens=12, temperature=0))
    assert " 6" in free.text
    (stopped,), outputs = run_to_end(core, [prompt],
                                     SamplingParams(max_tokens=12, temperature=0, stop=[" 6"]))
    streamed = "".join(d.text for d in outputs[0])
    assert stopped.finish_reason == "stop"
    assert streamed == stopped.text == free.text[: free.text.index(" 6")]


def test_prompt_limits(model_and_tokenizer):
    model, config, tok = model_and_tokenizer
    core = EngineCore(model, tok, config.n_vocab, n_blocks=64, max_model_len=32)
    with pytest.raises(PromptTooLong, match="maximum context length is 32"):
        core.add(list(range(100, 140)), SamplingParams(), lambda d: None)
    with pytest.raises(PromptTooLong, match="empty"):
        core.add([], SamplingParams(), lambda d: None)


def test_seeded_sampling_is_reproducible_and_top_k_one_is_greedy(model_and_tokenizer):
    model, config, tok = model_and_tokenizer
    core = EngineCore(model, tok, config.n_vocab, n_blocks=64, max_model_len=256)
    prompt = tok.encode("Once upon a time")
    sample = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=5)
    (a,), _ = run_to_end(core, [prompt], sample)
    (b,), _ = run_to_end(core, [prompt], sample)
    assert a.output_ids == b.output_ids
    (greedy,), _ = run_to_end(core, [prompt], SamplingParams(max_tokens=10, temperature=0))
    (top1,), _ = run_to_end(core, [prompt], SamplingParams(max_tokens=10, temperature=1.0,
                                                           top_k=1, seed=1))
    assert top1.output_ids == greedy.output_ids
    assert np.all(np.array(a.output_ids) < config.n_vocab)
