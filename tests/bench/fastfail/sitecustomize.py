"""For tests/bench/operator_scale.py's `--also-operator fastfail=tests/bench/fastfail`: the
operator phase run again with every decode engine's /metrics read failing at once (connection
refused), as on a host with no route to the fake (kwok) pods' IPs. On the development VM a
network proxy answers 404 for those IPs instead, so each engine is learned as NotReported. Python
imports this module at start-up because the folder is first on the operator's PYTHONPATH."""

from heteroserve_operator import decode_bindings

_metrics_url = decode_bindings.DecodeEngine.metrics_url


def _refused(self):
    return "http://127.0.0.1:9/metrics" if _metrics_url(self) else None


decode_bindings.DecodeEngine.metrics_url = _refused
