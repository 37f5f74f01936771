"""The router: one OpenAI endpoint over the accelerator and CPU tiers.

- `policy`: pure decisions (request + snapshot of upstreams -> tier, reason); its cost model in
  the module doc.
- `upstreams`: discovery (static or DNS), health checks, metrics scrape.
- `proxy`: the streaming pass-through (retries only before the first byte).
- `service`: the serving object behind the routes; `app`: the thin Starlette routes.
- `settings`: loading the configuration file (model in `protocol.router_config`).
"""
