"""The CPU engine's side of the KV hand-off (docs/kv-handoff.md): it imports KV that a prefill
engine computed (`do_remote_prefill`), and, so that one CPU engine can prefill for another, it
can also keep a request's KV for a pull (`do_remote_decode`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, Counter

from ..kv_handoff.export import KvExports
from ..kv_handoff.pull import KvPullError, pull_kv
from ..protocol.kv import KvHeader, KvTransferParams
from ..protocol.openai import ApiError
from .runner import EngineCore, ImportedKv, Sequence

# The answer to each pull failure: the router falls back on any of them.
PULL_STATUS = {"kv_params_invalid": 400, "kv_model_mismatch": 409}


@dataclass
class ModelShape:
    fingerprint: str
    rope: str  # "adjacent" | "neox"
    n_layer: int
    n_head_kv: int
    head_dim: int


class KvHandoff:
    def __init__(self, engine: EngineCore, shape: ModelShape, exports: KvExports,
                 client: httpx.AsyncClient | None = None, port: int = 0,
                 registry: CollectorRegistry | None = None):
        self.engine, self.shape, self.exports, self.port = engine, shape, exports, port
        self.client = client or httpx.AsyncClient()
        # Pulls through the exporter's shared directory when this engine mounts it too.
        self.shm_dir: Path | None = exports.shm_dir
        self.pulls = Counter("heteroserve:kv_pulls", "KV pulls by transport (tcp, shm) and "
                             "outcome (ok, or the error code)", ["transport", "outcome"],
                             registry=registry)

    def check_export(self, stream: bool) -> None:
        if not self.exports.enabled:
            raise ApiError(400, "kv_transfer_params: this engine does not export KV (start it "
                           "with --kv-token-file)", param="kv_transfer_params")
        if stream:
            raise ApiError(400, "kv_transfer_params: a prefill for a remote decode is not "
                           "streamed (stream: false)", param="kv_transfer_params")

    async def pull(self, params: KvTransferParams, prompt_ids: list[int]) -> ImportedKv:
        if not self.exports.token:
            raise ApiError(400, "kv_transfer_params: this engine has no KV token to pull with "
                           "(--kv-token-file)", param="kv_transfer_params")
        s = self.shape
        try:
            pulled = await pull_kv(self.client, params, self.exports.token, s.fingerprint,
                                   prompt_ids, s.rope, s.n_layer, s.n_head_kv, s.head_dim,
                                   shm_dir=self.shm_dir)
        except KvPullError as error:
            self.pulls.labels(error.transport, error.code).inc()
            raise ApiError(PULL_STATUS.get(error.code, 502), f"KV hand-off failed: "
                           f"{error.message}", code=error.code) from None
        self.pulls.labels(pulled.transport, "ok").inc()
        return ImportedKv(pulled.header.tokens, pulled.layers)

    def export(self, seq: Sequence) -> KvTransferParams:
        """Registers a finished sequence's kept KV under a handle; the params the router
        passes on to the decode engine."""
        s, engine, seq_id = self.shape, self.engine, seq.id
        tokens = engine.kept_tokens(seq_id)
        header = KvHeader(model_fingerprint=s.fingerprint, rope=s.rope, n_layer=s.n_layer,
                          n_head_kv=s.n_head_kv, head_dim=s.head_dim, tokens=len(tokens),
                          token_ids=list(tokens))
        handle = self.exports.add(header, lambda layer: engine.kept_layer(seq_id, layer),
                                  lambda: engine.release_kv(seq_id))
        return KvTransferParams(do_remote_prefill=True, remote_engine_id=self.exports.engine_id,
                                remote_handle=handle, remote_host=self.exports.advertise_host,
                                remote_port=self.port)
