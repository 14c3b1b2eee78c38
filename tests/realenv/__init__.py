"""The real test environment: Kubernetes control planes, an OCI registry, git servers and a
local Sigstore, all started on loopback by the tests themselves (test code, not shipped)."""
