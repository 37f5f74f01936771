"""The engine core: a paged KV cache, continuous batching with chunked prefill, and sampling.

One thread runs `step()` in a loop. Each step batches one token for every running sequence that
is decoding plus prefill chunks of sequences being admitted, up to `max_batch_tokens`, and runs a
single forward pass over them; the compiled model samples each finished sequence's next token
itself (`Model.sample`), so logits never reach Python: OpenAI's logit_bias and the frequency and
presence penalties go to it as a sparse list of additions per row (`SamplingParams.additions`),
and the log-probabilities come back from it. KV blocks (`block_size` tokens each) are
allocated as sequences grow; when the cache is full the newest running sequence is preempted and
recomputed later.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .tokenizer import GGUFTokenizer


class QueueFull(RuntimeError):
    """The engine already holds its maximum of waiting requests."""


class PromptTooLong(ValueError):
    """The prompt plus the requested tokens exceed max_model_len."""


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    # OpenAI's: added to the logits before sampling, the penalties per output token so far
    # (frequency: times its count; presence: once if it occurred).
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None  # None: none; k: the chosen token's and the k most probable

    def additions(self, counts: dict[int, int]) -> dict[int, float]:
        """Token id -> what to add to its logit, given the output tokens' counts so far."""
        added = dict(self.logit_bias)
        if self.frequency_penalty or self.presence_penalty:
            for token, count in counts.items():
                added[token] = (added.get(token, 0.0) - self.frequency_penalty * count
                                - self.presence_penalty)
        return added


@dataclass
class TokenLogprob:
    """A sampled token's log-probability and the most probable tokens' (id, log-probability),
    of the distribution it was drawn from before temperature, top-k and top-p."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Delta:
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    completion_tokens: int | None = None  # set on the final delta
    logprobs: list[TokenLogprob] | None = None  # the tokens since the last delta, when asked


@dataclass
class ImportedKv:
    """KV rows another engine computed for the first `tokens` prompt tokens (the KV hand-off):
    one (K rows, V rows) pair of fp16 bytes per layer, `tokens` rows each, K after RoPE."""

    tokens: int
    layers: list[tuple[bytes, bytes]]


@dataclass
class KeptKv:
    """A finished sequence's KV kept for a pull: its blocks and the tokens they hold."""

    blocks: list[int]
    token_ids: list[int]


_ids = itertools.count()
_entropy = random.SystemRandom()
_MASK64 = (1 << 64) - 1


@dataclass
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    emit: Callable[[Delta], None]
    id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    text: str = ""          # detokenized output so far (stop strings already cut)
    sent: int = 0           # characters of `text` already emitted
    finish_reason: str | None = None
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    last_token_at: float | None = None
    rng_state: int = 0      # the sampler's generator state (64 bits), advanced per token
    imported: ImportedKv | None = None  # written into its blocks at admission
    keep_kv: bool = False   # at the end, keep its KV for another engine to pull (kept_kv)
    counts: dict[int, int] = field(default_factory=dict)  # output token -> occurrences
    logprobs: list[TokenLogprob] = field(default_factory=list)  # not yet emitted

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids


class BlockAllocator:
    def __init__(self, n_blocks: int):
        self.n_blocks = n_blocks
        self.free = deque(range(n_blocks))

    def allocate(self, count: int) -> list[int] | None:
        if count > len(self.free):
            return None
        return [self.free.popleft() for _ in range(count)]

    def release(self, blocks: list[int]) -> None:
        self.free.extend(blocks)
        blocks.clear()

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.n_blocks


@dataclass
class EngineStats:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    imported_tokens: int = 0  # prompt tokens whose KV came from another engine


class EngineCore:
    def __init__(self, model, tokenizer: GGUFTokenizer, n_vocab: int, *, n_blocks: int,
                 block_size: int = 16, max_model_len: int = 2048, max_batch_tokens: int = 256,
                 max_running: int = 32, max_waiting: int = 256,
                 observe: Callable[[str, float], None] | None = None):
        self.model, self.tokenizer, self.n_vocab = model, tokenizer, n_vocab
        self.block_size, self.max_model_len = block_size, max_model_len
        self.max_batch_tokens, self.max_running, self.max_waiting = (max_batch_tokens,
                                                                     max_running, max_waiting)
        self.allocator = BlockAllocator(n_blocks)
        self.max_blocks = -(-max_model_len // block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = EngineStats()
        # (name, value): "ttft" and "itl" in seconds per token, "decode_batch" the number of
        # sequences that got a token in one step (steps that sample none are not observed)
        self.observe = observe or (lambda _name, _value: None)
        self._lock = threading.Condition()
        self._aborted: set[int] = set()
        self.kept: dict[int, KeptKv] = {}  # sequence id -> KV kept for a pull
        self._released: list[int] = []     # kept KV to free at the next step
        self._stop = False
        self._thread: threading.Thread | None = None

    # -- requests (any thread) ---------------------------------------------------------------
    def add(self, prompt_ids: list[int], params: SamplingParams, emit: Callable[[Delta], None],
            imported: ImportedKv | None = None, keep_kv: bool = False) -> Sequence:
        """`imported`: the KV of a prefix of the prompt, computed elsewhere; at most all but the
        last prompt token is used (that one is computed here, for its logits). `keep_kv`: keep
        the sequence's KV when it finishes, for another engine to pull (kept_layer)."""
        if not prompt_ids:
            raise PromptTooLong("the prompt is empty")
        if len(prompt_ids) + 1 > self.max_model_len:
            raise PromptTooLong(
                f"the prompt has {len(prompt_ids)} tokens; this model's maximum context length is "
                f"{self.max_model_len} tokens")
        seq = Sequence(list(prompt_ids), params, emit, keep_kv=keep_kv)
        if imported is not None and imported.tokens > 0 and len(prompt_ids) > 1:
            seq.imported = imported
        seed = params.seed if params.seed is not None else _entropy.getrandbits(64)
        seq.rng_state = seed & _MASK64
        with self._lock:
            if self.full():
                raise QueueFull(f"{len(self.waiting)} requests are already waiting")
            self.waiting.append(seq)
            self._lock.notify()
        return seq

    def full(self) -> bool:
        """Whether a request added now is refused (QueueFull): `max_waiting` wait besides those
        that the running batch's free places take at the next step. (A finished sequence's
        place may stay free for a step or two - its successor's prompt waits for the step's
        token budget - and a client that sends its next request at once must not be refused
        for that.) Read without the lock by the server, to refuse before tokenizing."""
        free = max(0, self.max_running - len(self.running))
        return len(self.waiting) >= self.max_waiting + free

    def load(self) -> tuple[int, int]:
        """(running, waiting), read together (any thread): a sequence moves between the two
        only under the lock, so a reader never sees one in neither list or in both, and their
        sum is the number of requests held (what admission counts)."""
        with self._lock:
            return len(self.running), len(self.waiting)

    def kept_tokens(self, seq_id: int) -> list[int]:
        """The tokens whose KV a finished sequence kept (KeyError when none is kept)."""
        return self.kept[seq_id].token_ids

    def kept_layer(self, seq_id: int, layer: int) -> tuple[bytes, bytes]:
        """One layer's (K rows, V rows) of a kept sequence, fp16 (any thread: its blocks are
        nobody else's until release_kv)."""
        kept, size = self.kept[seq_id], self.block_size
        slots = array("i", (kept.blocks[p // size] * size + p % size
                            for p in range(len(kept.token_ids))))
        return self.model.read_kv(layer, slots)

    def release_kv(self, seq_id: int) -> None:
        """Frees a kept sequence's blocks at the next step (pulled, or expired)."""
        with self._lock:
            self._released.append(seq_id)
            self._lock.notify()

    def abort(self, seq: Sequence) -> None:
        """Frees the sequence at the next step (a client went away)."""
        with self._lock:
            self._aborted.add(seq.id)
            self._lock.notify()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
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
                while (not self._stop and not self.waiting and not self.running
                       and not self._released):
                    self._lock.wait()
                if self._stop:
                    return
            self.step()

    # -- scheduling (engine thread) ----------------------------------------------------------
    def _reap_aborted(self) -> None:
        with self._lock:
            released, self._released = self._released, []
        for seq_id in released:
            kept = self.kept.pop(seq_id, None)
            if kept is not None:
                self.allocator.release(kept.blocks)
        with self._lock:
            aborted, self._aborted = self._aborted, set()
            if not aborted:
                return
            for seq in [s for s in self.waiting if s.id in aborted]:
                self.waiting.remove(seq)
        for seq in [s for s in self.running if s.id in aborted]:
            self._finish(seq, "abort", emit=False)

    def _ensure_blocks(self, seq: Sequence, upto: int) -> bool:
        need = -(-upto // self.block_size) - len(seq.blocks)
        if need <= 0:
            return True
        got = self.allocator.allocate(need)
        if got is None:
            return False
        seq.blocks.extend(got)
        return True

    def _import(self, seq: Sequence) -> None:
        """Writes the imported KV rows into the sequence's blocks: those prompt positions count
        as computed (a preemption later drops them like any other)."""
        kv, size = seq.imported, self.block_size
        seq.imported = None
        used = min(kv.tokens, len(seq.prompt_ids) - 1)
        slots = array("i", (seq.blocks[p // size] * size + p % size for p in range(used)))
        row = len(kv.layers[0][0]) // kv.tokens
        for layer, (k_rows, v_rows) in enumerate(kv.layers):
            self.model.write_kv(layer, slots, k_rows[:used * row], v_rows[:used * row])
        seq.num_computed = used
        self.stats.imported_tokens += used

    def _preempt(self, seq: Sequence) -> None:
        """Recompute later: its KV is dropped, its tokens (prompt + output) are kept."""
        self.allocator.release(seq.blocks)
        seq.num_computed = 0
        self.stats.preemptions += 1
        with self._lock:  # one move, as `load` sees it
            self.running.remove(seq)
            self.waiting.appendleft(seq)

    def _schedule(self) -> list[tuple[Sequence, int]]:
        """(sequence, tokens to compute this step) for this step's batch."""
        batch: list[tuple[Sequence, int]] = []
        budget = self.max_batch_tokens
        for seq in list(self.running):
            remaining = len(seq.tokens) - seq.num_computed
            if remaining == 1:  # decoding
                while not self._ensure_blocks(seq, len(seq.tokens)):
                    victim = self.running[-1]
                    self._preempt(victim)
                    batch = [(s, n) for s, n in batch if s is not victim]
                    if victim is seq:
                        break
                if seq in self.running:
                    batch.append((seq, 1))
                    budget -= 1
        for seq in list(self.running):  # prefill chunks of admitted sequences
            remaining = len(seq.tokens) - seq.num_computed
            if remaining > 1 and budget > 0:
                chunk = min(remaining, budget)
                if self._ensure_blocks(seq, seq.num_computed + chunk):
                    batch.append((seq, chunk))
                    budget -= chunk
        while budget > 0 and len(self.running) < self.max_running:
            with self._lock:
                if not self.waiting:
                    break
                seq = self.waiting[0]
            if seq.imported is not None:
                if not self._ensure_blocks(seq, len(seq.prompt_ids)):
                    break
                self._import(seq)
            chunk = min(len(seq.tokens) - seq.num_computed, budget)
            if not self._ensure_blocks(seq, seq.num_computed + chunk):
                break
            with self._lock:  # one move, as `load` sees it
                self.waiting.popleft()
                self.running.append(seq)
            batch.append((seq, chunk))
            budget -= chunk
        return batch

    def step(self) -> int:
        self._reap_aborted()
        batch = self._schedule()
        self._publish_stats()
        if not batch:
            time.sleep(0.001)
            return 0
        tokens, positions, seq_index, logit_rows, sampled = (array("i"), array("i"), array("i"),
                                                             array("i"), [])
        tables = array("i", bytes(4 * len(batch) * self.max_blocks))
        for slot, (seq, count) in enumerate(batch):
            tables[slot * self.max_blocks:slot * self.max_blocks + len(seq.blocks)] = array(
                "i", seq.blocks)
            start = seq.num_computed
            tokens.extend(seq.tokens[start:start + count])
            positions.extend(range(start, start + count))
            seq_index.extend([slot] * count)
            if start + count == len(seq.tokens):
                logit_rows.append(len(tokens) - 1)
                sampled.append(seq)
        params = [seq.params for seq in sampled]
        add_row, add_id, add_value = array("i"), array("i"), array("f")
        for row, seq in enumerate(sampled):
            for token, value in seq.params.additions(seq.counts).items():
                add_row.append(row)
                add_id.append(token)
                add_value.append(value)
        logprobs = ([-1 if p.logprobs is None else p.logprobs for p in params]
                    if any(p.logprobs is not None for p in params) else [])
        ids, states, *chosen = self.model.sample(
            tokens, positions, seq_index,
            memoryview(tables).cast("B").cast("i", (len(batch), self.max_blocks)), logit_rows,
            [p.temperature for p in params], [p.top_k for p in params],
            [p.top_p for p in params], [seq.rng_state for seq in sampled],
            add_row.tolist(), add_id.tolist(), add_value.tolist(), logprobs)
        row_logprobs = chosen[0] if chosen else [None] * len(sampled)
        if sampled:
            self.observe("decode_batch", len(sampled))
        for seq, count in batch:
            if seq.num_computed < len(seq.prompt_ids):
                self.stats.prompt_tokens += min(count, len(seq.prompt_ids) - seq.num_computed)
            seq.num_computed += count
        now = time.monotonic()
        for seq, token, state, entries in zip(sampled, ids, states, row_logprobs, strict=True):
            seq.rng_state = state
            if entries is not None:
                seq.logprobs.append(TokenLogprob(token, entries[0][1], entries[1:]))
            self._append(seq, token, now)
        return len(tokens)

    # -- output --------------------------------------------------------------------------------
    def _append(self, seq: Sequence, token: int, now: float) -> None:
        if seq.first_token_at is None:
            seq.first_token_at = now
            self.observe("ttft", now - seq.arrival)
        else:
            self.observe("itl", now - seq.last_token_at)
        seq.last_token_at = now
        self.stats.generated_tokens += 1
        tok = self.tokenizer
        if token == tok.eos_id and not seq.params.ignore_eos:
            if seq.logprobs:  # EOS is no output token (nor counted in usage)
                seq.logprobs.pop()
            self._finish(seq, "stop")
            return
        seq.output_ids.append(token)
        seq.counts[token] = seq.counts.get(token, 0) + 1
        text = tok.decode(seq.output_ids)
        finish = None
        for stop in seq.params.stop:
            cut = text.find(stop, max(0, len(seq.text) - len(stop)))
            if stop and cut >= 0:
                text, finish = text[:cut], "stop"
                break
        if finish is None and len(seq.output_ids) >= seq.params.max_tokens:
            finish = "length"
        if finish is None and len(seq.tokens) >= self.max_model_len:
            finish = "length"
        seq.text = text
        if finish:
            self._finish(seq, finish)
            return
        # Hold back an incomplete UTF-8 sequence and any prefix of a stop string.
        safe = len(text) - (1 if text.endswith("\ufffd") else 0)
        for stop in seq.params.stop:
            for size in range(min(len(stop) - 1, safe), 0, -1):
                if text[:safe].endswith(stop[:size]):
                    safe -= size
                    break
        if safe > seq.sent:
            seq.emit(Delta(text[seq.sent:safe], [token], logprobs=self._take_logprobs(seq)))
            seq.sent = safe

    def _finish(self, seq: Sequence, reason: str, emit: bool = True) -> None:
        seq.finish_reason = reason
        with self._lock:
            if seq in self.running:
                self.running.remove(seq)
        if seq.keep_kv and reason != "abort" and seq.num_computed:
            self.kept[seq.id] = KeptKv(seq.blocks, seq.tokens[:seq.num_computed])
            seq.blocks = []
        else:
            self.allocator.release(seq.blocks)
        if emit:
            seq.emit(Delta(seq.text[seq.sent:], [], reason, len(seq.output_ids),
                           logprobs=self._take_logprobs(seq)))
            seq.sent = len(seq.text)

    @staticmethod
    def _take_logprobs(seq: Sequence) -> list[TokenLogprob] | None:
        if seq.params.logprobs is None:
            return None
        taken, seq.logprobs = seq.logprobs, []
        return taken

    def _publish_stats(self) -> None:
        self.stats.running, self.stats.waiting = self.load()
        self.stats.kv_usage = self.allocator.usage
