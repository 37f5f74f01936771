"""The KV hand-off between engines (docs/kv-handoff.md), shared by the engines that export KV
(the builtin prefill engine, and the CPU engine for CPU-to-CPU hand-offs) and the engine that
imports it (the CPU engine):

- `export`: the handles of kept KV, their pull token and expiry, and the pull route;
- `pull`: fetching and verifying a handle's stream.

The wire format itself is a contract: `protocol.kv`.
"""
