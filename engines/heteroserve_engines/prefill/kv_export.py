"""The prefill side of the KV hand-off: a finished prefill's prompt KV under a `KvExports`
handle, and the `kv_transfer_params` answered for it (vLLM's disaggregated shape: the decode
engine is told to pull from here, `do_remote_prefill`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..cpu_engine.gguf_file import GGUFFile, weights_identity
from ..cpu_engine.gguf_model import ModelConfig
from ..kv_handoff.export import KvExports
from ..protocol.kv import KvHeader, KvTransferParams, model_fingerprint
from .engine import PrefillEngine
from .sequence import Sequence


@dataclass(frozen=True)
class KvDescription:
    """What every exported header says about this model."""

    fingerprint: str
    rope: str
    n_layer: int
    n_head_kv: int
    head_dim: int

    @classmethod
    def of(cls, reader: GGUFFile, config: ModelConfig) -> KvDescription:
        return cls(model_fingerprint(weights_identity(reader)),
                   "neox" if config.rope_neox else "adjacent", config.n_layer,
                   config.n_head_kv, config.head_dim)

    def header(self, token_ids: list[int]) -> KvHeader:
        return KvHeader(model_fingerprint=self.fingerprint, rope=self.rope, n_layer=self.n_layer,
                        n_head_kv=self.n_head_kv, head_dim=self.head_dim, tokens=len(token_ids),
                        token_ids=token_ids)


def export_kept(exports: KvExports, engine: PrefillEngine, description: KvDescription,
                seq: Sequence, port: int) -> KvTransferParams:
    """Puts a finished prefill's kept KV under a handle (on the event loop); the handle's
    release frees its blocks in the engine."""
    kept = engine.kept[seq.id]
    handle = exports.add(description.header(kept.token_ids),
                         lambda layer: engine.read_kv(seq.id, layer),
                         lambda: engine.release_kv(seq.id))
    return KvTransferParams(do_remote_prefill=True, remote_engine_id=exports.engine_id,
                            remote_handle=handle, remote_host=exports.advertise_host,
                            remote_port=port,
                            remote_block_ids=None)
