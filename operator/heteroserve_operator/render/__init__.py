"""Pure rendering: an InferenceDeployment spec (plus the cluster facts the reconciler read) in,
the desired child manifests out. No I/O, no kopf, no API client (import-linter enforces it)."""
