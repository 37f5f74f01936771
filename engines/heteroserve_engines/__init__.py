"""heteroserve's data plane: the router sidecar, the CPU decode engine and the prefill engine.

It never imports the control plane (`heteroserve_operator`); the operator starts it through
command lines and environment variables, exactly as a pod spec would.
"""
