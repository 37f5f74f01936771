"""A real Kubernetes control plane for heteroserve's tests, built from Go modules, no Docker.

etcd + kube-apiserver + kube-controller-manager + kube-scheduler on loopback with TLS and RBAC,
and kwok running the pods scheduled onto fake nodes that are the seeds' machines (nodes.yaml).
`python -m tests.cluster up|down|status` runs it by hand; tests use the `cluster` fixture.
"""
