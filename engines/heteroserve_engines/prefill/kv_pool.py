"""The KV budget: one preallocated pool of token slots on the device, handed out in blocks.

`budget_tokens` (the engine's `--kv-budget-tokens`, its analogue of vLLM's
`--gpu-memory-utilization`) slots of K (after RoPE) and V rows, `[n_layer][2][slots][n_head_kv *
head_dim]` in the model's dtype, allocated once at start so that the budget is memory actually
held. Sequences own whole blocks of `BLOCK_SIZE` slots; a sequence of n tokens needs
ceil(n / BLOCK_SIZE) of them. Owned by the engine thread, except `read`, which a KV pull calls
from another thread for blocks nobody else writes until they are released.
"""

from __future__ import annotations

from collections import deque

import torch

BLOCK_SIZE = 16


class KvPool:
    def __init__(self, n_layer: int, kv_dim: int, budget_tokens: int, device: torch.device,
                 dtype: torch.dtype, block_size: int = BLOCK_SIZE):
        self.block_size = block_size
        self.n_blocks = budget_tokens // block_size
        if self.n_blocks < 1:
            raise ValueError(f"a KV budget of {budget_tokens} tokens holds no block of "
                             f"{block_size}")
        # Zeroed, not empty: padded attention reads only masked slots of its own sequence, but
        # a NaN bit pattern times a zero weight would still be NaN.
        self.data = torch.zeros(n_layer, 2, self.n_blocks * block_size, kv_dim, device=device,
                                dtype=dtype)
        self.free = deque(range(self.n_blocks))

    @property
    def budget_tokens(self) -> int:
        return self.n_blocks * self.block_size

    @property
    def bytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.n_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def allocate(self, count: int) -> list[int] | None:
        if count > len(self.free):
            return None
        return [self.free.popleft() for _ in range(count)]

    def release(self, blocks: list[int]) -> None:
        self.free.extend(blocks)
        blocks.clear()

    def slots(self, blocks: list[int], start: int, stop: int) -> list[int]:
        """The slots of positions start..stop-1 of a sequence owning `blocks`."""
        size = self.block_size
        return [blocks[p // size] * size + p % size for p in range(start, stop)]

    def read(self, layer: int, slots: list[int]) -> tuple[bytes, bytes]:
        """(K rows, V rows) of the slots: fp16 little-endian, [len(slots)][kv_dim] each (the
        KV hand-off's rows), copied to host memory."""
        index = torch.tensor(slots, dtype=torch.long, device=self.data.device)
        rows = self.data[layer].index_select(1, index).to(torch.float16).cpu().contiguous()
        k, v = rows[0].numpy(), rows[1].numpy()
        return k.astype("<f2", copy=False).tobytes(), v.astype("<f2", copy=False).tobytes()
