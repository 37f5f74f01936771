"""heteroserve's control plane: the InferenceDeployment API, pure rendering, and the kopf operator.

Layering (enforced by import-linter, see pyproject.toml): `api` and `render` are pure data
transformations and never import kopf or an API client; only the reconcile layer talks to the
API server.
"""
