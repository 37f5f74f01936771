"""One request in the engine: its tokens, its KV blocks, its detokenized text and stop handling.

The output rules are the CPU engine's (cpu_engine/runner.py), so both engines answer alike: EOS
ends with "stop" unless `ignore_eos`; a stop string cuts the text before it and ends with
"stop"; `max_tokens` or the context ends with "length"; an incomplete UTF-8 character and any
prefix of a stop string are held back from the stream until resolved.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..cpu_engine.runner import Delta, SamplingParams

_ids = itertools.count()


@dataclass
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    emit: Callable[[Delta], None]
    generator: torch.Generator
    keep_kv: bool = False   # a prefill for a remote decode: keep the prompt's KV at the end
    id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0   # tokens whose K/V are in the pool
    text: str = ""          # detokenized output so far (stop strings already cut)
    sent: int = 0           # characters of `text` already emitted
    finish_reason: str | None = None
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    last_token_at: float | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def append(self, token: int, eos_id: int | None, decode: Callable[[list[int]], str],
               max_model_len: int) -> tuple[str, str | None]:
        """Takes a sampled token: (text now safe to emit, finish reason or None)."""
        if token == eos_id and not self.params.ignore_eos:
            return "", "stop"
        self.output_ids.append(token)
        text = decode(self.output_ids)
        finish = None
        for stop in self.params.stop:
            cut = text.find(stop, max(0, len(self.text) - len(stop)))
            if stop and cut >= 0:
                text, finish = text[:cut], "stop"
                break
        if finish is None and (len(self.output_ids) >= self.params.max_tokens
                               or len(self.tokens) >= max_model_len):
            finish = "length"
        self.text = text
        if finish:
            return "", finish
        safe = len(text) - (1 if text.endswith("\ufffd") else 0)
        for stop in self.params.stop:
            for size in range(min(len(stop) - 1, safe), 0, -1):
                if text[:safe].endswith(stop[:size]):
                    safe -= size
                    break
        if safe <= self.sent:
            return "", None
        chunk, self.sent = text[self.sent:safe], safe
        return chunk, None

    def rest(self) -> str:
        """The text not emitted yet (at the end)."""
        chunk, self.sent = self.text[self.sent:], len(self.text)
        return chunk
