"""The scheduler: waiting and running queues over the KV pool, one engine thread.

Each step, in this order:

1. aborted sequences (clients gone) and released exports give their blocks back;
2. every running sequence reserves the slot of its next token; when the pool is short, the
   newest running sequence is preempted (its KV dropped, its tokens kept: it is recomputed when
   readmitted, vLLM's recompute preemption) until the older ones fit;
3. waiting prompts are admitted first come, first served while their whole KV fits the pool,
   `max_num_seqs` and `max_batched_tokens` allow, and prefilled together in one forward pass;
4. the sequences that were already running decode one token each, in one forward pass.

A sequence with `keep_kv` (a prefill for a remote decode) ends after its first token and keeps
its prompt's blocks until the export is pulled or expires (`release_kv`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..cpu_engine.runner import Delta, PromptTooLong, QueueFull, SamplingParams
from ..cpu_engine.tokenizer import GGUFTokenizer
from .kv_pool import KvPool
from .model import Chunk, LlamaModel
from .sampling import new_generator, sample
from .sequence import Sequence

log = logging.getLogger("heteroserve.prefill")
_entropy = random.SystemRandom()


@dataclass
class KeptKv:
    blocks: list[int]
    token_ids: list[int]


@dataclass
class EngineStats:
    prompt_tokens: int = 0      # computed, recomputation after preemption included
    generated_tokens: int = 0
    preemptions: int = 0


class PrefillEngine:
    def __init__(self, model: LlamaModel, pool: KvPool, tokenizer: GGUFTokenizer, *,
                 max_model_len: int, max_num_seqs: int = 32, max_waiting: int = 256,
                 max_batched_tokens: int = 8192,
                 observe: Callable[[str, float], None] | None = None):
        if pool.budget_tokens < max_model_len:
            raise ValueError(f"the KV budget ({pool.budget_tokens} tokens) must hold at least "
                             f"one sequence of max_model_len ({max_model_len})")
        self.model, self.pool, self.tokenizer = model, pool, tokenizer
        self.max_model_len, self.max_num_seqs, self.max_waiting = (max_model_len, max_num_seqs,
                                                                   max_waiting)
        self.max_batched_tokens = max(max_batched_tokens, max_model_len)
        self.observe = observe or (lambda _name, _value: None)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.kept: dict[int, KeptKv] = {}
        self.stats = EngineStats()
        self._lock = threading.Condition()
        self._aborted: set[int] = set()
        self._stop = False
        self._news = 0  # requests and aborts so far: what may unblock a stalled queue
        self._thread: threading.Thread | None = None

    @property
    def n_vocab(self) -> int:
        return self.model.config.n_vocab

    # -- requests (any thread) ---------------------------------------------------------------
    def add(self, prompt_ids: list[int], params: SamplingParams, emit: Callable[[Delta], None],
            keep_kv: bool = False) -> Sequence:
        if not prompt_ids:
            raise PromptTooLong("the prompt is empty")
        if len(prompt_ids) + 1 > self.max_model_len:
            raise PromptTooLong(
                f"the prompt has {len(prompt_ids)} tokens; this model's maximum context length is "
                f"{self.max_model_len} tokens")
        seed = params.seed if params.seed is not None else _entropy.getrandbits(63)
        seq = Sequence(list(prompt_ids), params, emit, new_generator(seed & (2**63 - 1)),
                       keep_kv=keep_kv)
        with self._lock:
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(f"{len(self.waiting)} requests are already waiting")
            self.waiting.append(seq)
            self._news += 1
            self._lock.notify()
        return seq

    def abort(self, seq_id: int) -> None:
        """Frees the sequence, or the KV it kept, at the next step (a client went away, an
        export was pulled or expired)."""
        with self._lock:
            self._aborted.add(seq_id)
            self._news += 1
            self._lock.notify()

    release_kv = abort

    def read_kv(self, seq_id: int, layer: int) -> tuple[bytes, bytes]:
        """(K rows, V rows) of one layer of a kept sequence, fp16 (any thread: its blocks are
        nobody else's until released). KeyError when nothing is kept under it."""
        kept = self.kept[seq_id]
        return self.pool.read(layer, self.pool.slots(kept.blocks, 0, len(kept.token_ids)))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="prefill-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        if self._thread:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not (self._stop or self.waiting or self.running or self._aborted):
                    self._lock.wait()
                if self._stop:
                    return
                news = self._news
            if not self.step():
                # Requests wait while kept exports fill the budget: sleep until an abort, a
                # release or a new request, not in a busy loop.
                with self._lock:
                    if self._news == news and not self._stop:
                        self._lock.wait(timeout=0.5)

    # -- the step (engine thread) ------------------------------------------------------------
    def step(self) -> int:
        """One scheduling step; the number of tokens computed."""
        self._reap()
        decoding = self._reserve_decode()
        admitted = self._admit()
        computed = 0
        if admitted:
            computed += self._run([(s, Chunk(s.tokens, 0, s.blocks)) for s in admitted])
        if decoding:
            computed += self._run([(s, Chunk(s.tokens[-1:], s.num_computed, s.blocks))
                                   for s in decoding])
        return computed

    def _reap(self) -> None:
        with self._lock:
            aborted, self._aborted = self._aborted, set()
            for seq in [s for s in self.waiting if s.id in aborted]:
                self.waiting.remove(seq)
                seq.finish_reason = "abort"
        for seq_id in aborted:
            kept = self.kept.pop(seq_id, None)
            if kept is not None:
                self.pool.release(kept.blocks)
        for seq in [s for s in self.running if s.id in aborted]:
            self._finish(seq, "abort", emit=False)

    def _grow(self, seq: Sequence, tokens: int) -> bool:
        need = self.pool.blocks_for(tokens) - len(seq.blocks)
        if need <= 0:
            return True
        got = self.pool.allocate(need)
        if got is None:
            return False
        seq.blocks.extend(got)
        return True

    def _reserve_decode(self) -> list[Sequence]:
        for seq in list(self.running):
            while seq in self.running and not self._grow(seq, len(seq.tokens)):
                self._preempt(self.running[-1])
        return list(self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.pool.release(seq.blocks)
        seq.num_computed = 0
        self.stats.preemptions += 1
        with self._lock:
            self.waiting.appendleft(seq)

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        tokens = 0
        while len(self.running) + len(admitted) < self.max_num_seqs:
            with self._lock:
                if not self.waiting:
                    break
                seq = self.waiting[0]
            if tokens + len(seq.tokens) > self.max_batched_tokens or not self._grow(
                    seq, len(seq.tokens)):
                break
            with self._lock:
                self.waiting.popleft()
            admitted.append(seq)
            tokens += len(seq.tokens)
        return admitted

    def _run(self, batch: list[tuple[Sequence, Chunk]]) -> int:
        seqs = [seq for seq, _ in batch]
        try:
            logits = self.model.forward([chunk for _, chunk in batch], self.pool)
            params = [seq.params for seq in seqs]
            tokens = sample(logits, [p.temperature for p in params], [p.top_k for p in params],
                            [p.top_p for p in params], [seq.generator for seq in seqs])
        except Exception:  # a failed step ends its requests, not the engine
            log.exception("a forward step of %d sequences failed", len(seqs))
            for seq in seqs:
                self._finish(seq, "error")
            return 0
        now = time.monotonic()
        for (seq, chunk), token in zip(batch, tokens, strict=True):
            self.stats.prompt_tokens += max(0, min(len(chunk.tokens),
                                                   len(seq.prompt_ids) - seq.num_computed))
            seq.num_computed += len(chunk.tokens)
            if seq not in self.running:
                self.running.append(seq)
            self._append(seq, token, now)
        return sum(len(chunk.tokens) for _, chunk in batch)

    def _append(self, seq: Sequence, token: int, now: float) -> None:
        if seq.first_token_at is None:
            seq.first_token_at = now
            self.observe("ttft", now - seq.arrival)
        else:
            self.observe("itl", now - seq.last_token_at)
        seq.last_token_at = now
        self.stats.generated_tokens += 1
        text, finish = seq.append(token, self.tokenizer.eos_id, self.tokenizer.decode,
                                  self.max_model_len)
        if seq.keep_kv and finish is None:
            finish = "length"  # a prefill for a remote decode ends after its first token
        if finish:
            self._finish(seq, finish)
        elif text:
            seq.emit(Delta(text, [token]))

    def _finish(self, seq: Sequence, reason: str, emit: bool = True) -> None:
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        if seq.keep_kv and reason in ("stop", "length"):
            prompt = len(seq.prompt_ids)
            keep = self.pool.blocks_for(prompt)
            self.kept[seq.id] = KeptKv(seq.blocks[:keep], list(seq.prompt_ids))
            self.pool.release(seq.blocks[keep:])
            seq.blocks = []
        else:
            self.pool.release(seq.blocks)
        if emit:
            seq.emit(Delta(seq.rest(), [], reason, len(seq.output_ids)))
