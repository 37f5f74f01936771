"""The data plane's contracts: everything that crosses a process or plane boundary.

- `openai`: the OpenAI wire models (requests, responses, stream chunks, errors) and the SSE
  encoder, shared by the CPU engine's server and the router.
- `router_config`: the router's configuration file, rendered by the operator and read by the
  router (`RouterConfig.load`).
- `binding`: the seeds' CPU-binding environment names and the CPU-list syntax.

This package imports nothing else of heteroserve (pydantic and the standard library only): it is
what the operator may import from the data plane, and nothing else (import-linter contracts in
pyproject.toml).
"""
