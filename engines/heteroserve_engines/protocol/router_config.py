"""The router's configuration: what the operator renders into the router's ConfigMap and what
`heteroserve router --config` (and `heteroserve run`) load. camelCase in YAML, like the CRD.

Defaults follow sysHAX where it has one (health checks every 10 s with a 3 s timeout, removed
after 3 failures; the conductor on port 8010).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

Policy = Literal["auto", "accelerator", "cpu", "split"]
TierName = Literal["accelerator", "cpu"]
TIERS: tuple[TierName, ...] = ("accelerator", "cpu")


class ConfigModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              frozen=True)


class Listen(ConfigModel):
    host: str = Field(default="127.0.0.1", description="Address to bind (0.0.0.0 in a pod).")
    port: int = Field(default=8010, ge=1, le=65535, description="The sysHAX conductor's 8010.")


class HealthCheck(ConfigModel):
    """An upstream failing `failure_threshold` checks in a row is removed from routing; one
    passing check re-admits it."""

    interval_seconds: float = Field(default=10, gt=0, description="Between checks (sysHAX: 10 s).")
    timeout_seconds: float = Field(default=3, gt=0, description="Per check (sysHAX: 3 s).")
    failure_threshold: int = Field(default=3, ge=1, description="Failures before removal.")


class TierConfig(ConfigModel):
    """The engines of one tier."""

    urls: list[str] = Field(min_length=1, description="Base URLs (scheme://host:port), no /v1.")
    discovery: Literal["static", "dns"] = Field(
        default="static",
        description="dns: each URL's host is a headless Service name re-resolved every "
        "`resolveIntervalSeconds`; every address it resolves to is an upstream.")
    resolve_interval_seconds: float = Field(default=10, gt=0, description="DNS re-resolution.")
    api_prefix: str = Field(default="/v1", description="Prefix of the OpenAI routes.")
    models_path: str = Field(default="/v1/models",
                             description="Model list (KsanaLLM: /models, without /v1).")
    health_path: str | None = Field(default="/health",
                                    description="200 when serving; unset: the models path.")
    metrics_path: str | None = Field(default="/metrics",
                                     description="Prometheus text under vLLM's names; unset: "
                                     "load is only what the router itself has in flight.")
    served_model_name: str | None = Field(
        default=None, description="The name the engine serves, when it is not the router's "
        "model name (the router rewrites `model`).")
    max_concurrency: int = Field(default=256, ge=1,
                                 description="Requests in flight per upstream before the router "
                                 "stops admitting to it.")
    same_node: bool = Field(default=False, description="These engines share the router's node "
                            "(sysHAX placement): preferred for offload.")
    kv_export: bool = Field(default=False, description="These engines keep a prefill's KV for "
                            "a pull (kv_transfer_params do_remote_decode): the accelerator side "
                            "of a split.")
    kv_import: bool = Field(default=False, description="These engines continue from pulled KV "
                            "(do_remote_prefill): the CPU side of a split.")

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"upstream URL {url!r} must be http(s)://host[:port]")
            if parts.path not in ("", "/"):
                raise ValueError(f"upstream URL {url!r} must not have a path (the API prefix is "
                                 "apiPrefix)")
        return [url.rstrip("/") for url in urls]


class Offload(ConfigModel):
    """When `auto` moves new requests off the accelerator (sysHAX's "PD offloading when swap-out
    is triggered", generalised)."""

    kv_cache_usage_threshold: float = Field(
        default=0.9, gt=0, le=1, description="Accelerator KV-cache usage fraction that starts "
        "offloading (older sysHAX: 90 %).")
    waiting_threshold: int = Field(default=1, ge=1, description="Requests waiting on one "
                                   "accelerator engine that start offloading (its queue grows).")
    hysteresis: float = Field(default=0.1, ge=0, lt=1, description="Offloading stops once KV "
                              "usage is this far below the threshold and nothing waits.")
    hold_seconds: float = Field(default=2, ge=0, description="Least time offloading stays on "
                                "once started: keeps decisions from flapping.")
    min_cpu_tokens_per_second: float = Field(
        default=10, ge=0, description="Offload only while the CPU tier decodes at least this "
        "fast per sequence (measured from its metrics).")
    cpu_max_batch_size: int = Field(default=16, ge=1, description="Concurrent sequences the "
                                    "router sends to one CPU engine.")


class Limits(ConfigModel):
    max_body_bytes: int = Field(default=4 * 2**20, ge=1024, description="Larger request bodies "
                                "are answered 413 before they are read whole.")
    retry_after_seconds: int = Field(default=1, ge=1, description="Retry-After on a 429.")


class RouterConfig(ConfigModel):
    """One router: a model, the tiers it routes to, and how it decides."""

    model: str = Field(min_length=1, description="Served model name clients send.")
    listen: Listen = Field(default_factory=Listen)
    policy: Policy = "auto"
    request_timeout_seconds: float = Field(default=600, gt=0, description="Whole request.")
    connect_timeout_seconds: float = Field(default=5, gt=0, description="Per upstream connect.")
    idle_timeout_seconds: float = Field(
        default=60, gt=0, description="Longest silence from an upstream while streaming (before "
        "its first byte: then another upstream is tried; between chunks: the stream ends with "
        "an error event). A non-streaming answer may take up to requestTimeoutSeconds.")
    drain_seconds: float = Field(default=20, ge=0, description="On SIGTERM: how long in-flight "
                                 "requests may run on before they are ended with a final "
                                 "error chunk; new requests get 503 meanwhile.")
    retries: int = Field(default=1, ge=0, description="Other upstreams tried before the first "
                         "byte (connection errors, 5xx, 429).")
    scrape_interval_seconds: float = Field(default=1, gt=0, description="Metrics scrape period.")
    health: HealthCheck = Field(default_factory=HealthCheck)
    offload: Offload = Field(default_factory=Offload)
    limits: Limits = Field(default_factory=Limits)
    accelerator: TierConfig | None = None
    cpu: TierConfig | None = None
    api_keys_file: str | None = Field(default=None, description="One key per line; unset: no "
                                      "authentication.")

    @model_validator(mode="after")
    def _tiers_for_policy(self) -> RouterConfig:
        needs = {"accelerator": ("accelerator",), "cpu": ("cpu",),
                 "split": ("accelerator", "cpu")}.get(self.policy, ())
        missing = [tier for tier in needs if getattr(self, tier) is None]
        if missing:
            raise ValueError(f"policy {self.policy} needs the {' and '.join(missing)} tier")
        if self.accelerator is None and self.cpu is None:
            raise ValueError("at least one of the accelerator and cpu tiers must be configured")
        return self

    def document(self) -> dict:
        """The file form: camelCase keys, every field (a null says "off", e.g. no health path:
        its default is not null), YAML-ready."""
        return self.model_dump(mode="json", by_alias=True)

    @property
    def kv_handoff(self) -> bool:
        """Whether a split is possible: the accelerator exports KV and the CPU tier imports it."""
        return bool(self.accelerator and self.accelerator.kv_export and self.cpu
                    and self.cpu.kv_import)

    def tier(self, name: TierName) -> TierConfig | None:
        return self.accelerator if name == "accelerator" else self.cpu
