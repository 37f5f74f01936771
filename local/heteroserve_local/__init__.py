"""`heteroserve run`: one InferenceDeployment served on this machine, without a cluster.

The operator's pure render turns the spec into Deployments and ConfigMaps; `plan` turns those into
local processes (their command lines, environment and configuration files, rewritten for
loopback); `supervisor` runs them. Above both planes: it imports the operator's render and the
data plane's contracts, and neither imports it (import-linter enforces it).
"""
