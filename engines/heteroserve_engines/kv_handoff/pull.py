"""The importing side: pull a handle's stream from the exporting engine and verify it."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from ..protocol.kv import KvHeader, KvProtocolError, KvStreamReader, KvTransferParams


class KvPullError(Exception):
    """The KV could not be pulled or verified; `code` names why (for the error answered)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


@dataclass
class PulledKv:
    header: KvHeader
    layers: list[tuple[bytes, bytes]]
    wire_bytes: int


async def pull_kv(client: httpx.AsyncClient, params: KvTransferParams, token: bytes,
                  fingerprint: str, prompt_ids: list[int], rope: str, n_layer: int,
                  n_head_kv: int, head_dim: int, timeout: float = 60) -> PulledKv:
    """Fetches `params.remote_handle` from `params.remote_host:remote_port` and checks it
    against this engine's model (fingerprint, RoPE, shapes) and the request's prompt (the KV's
    tokens must be its prefix). Raises KvPullError."""
    if not (params.remote_host and params.remote_port and params.remote_handle):
        raise KvPullError("kv_params_invalid", "kv_transfer_params with do_remote_prefill need "
                          "remote_host, remote_port and remote_handle")
    url = f"http://{params.remote_host}:{params.remote_port}/v1/kv/{params.remote_handle}"
    reader = KvStreamReader(expect_fingerprint=fingerprint)
    layers: list[tuple[bytes, bytes]] = []
    header: KvHeader | None = None
    size = 0
    try:
        async with client.stream("GET", url, timeout=timeout,
                                 headers={"authorization": "Bearer " + token.decode()}) as response:
            if response.status_code != 200:
                await response.aread()
                raise KvPullError("kv_pull_refused", f"the exporting engine answered HTTP "
                                  f"{response.status_code} for the KV handle")
            async for chunk in response.aiter_raw():
                size += len(chunk)
                for event in reader.feed(chunk):
                    if event[0] == "header":
                        header = event[1]
                        _check_header(header, prompt_ids, rope, n_layer, n_head_kv, head_dim)
                    elif event[0] == "layer":
                        layers.append((event[2], event[3]))
            reader.finish()
    except KvProtocolError as error:
        code = "kv_model_mismatch" if "fingerprint" in str(error) else "kv_stream_invalid"
        raise KvPullError(code, str(error)) from None
    except httpx.HTTPError as error:
        raise KvPullError("kv_pull_failed", f"pulling the KV failed: {type(error).__name__}"
                          ) from None
    return PulledKv(header, layers, size)


def _check_header(header: KvHeader, prompt_ids: list[int], rope: str, n_layer: int,
                  n_head_kv: int, head_dim: int) -> None:
    if (header.rope, header.n_layer, header.n_head_kv, header.head_dim) != (
            rope, n_layer, n_head_kv, head_dim):
        raise KvProtocolError("model fingerprint mismatch: RoPE convention or KV shape differs")
    if header.tokens > len(prompt_ids) or header.token_ids != prompt_ids[:header.tokens]:
        raise KvProtocolError("the KV's tokens are not a prefix of this request's prompt")
