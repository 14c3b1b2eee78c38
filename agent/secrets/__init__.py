"""Secrets in bundles: SOPS files encrypted to each cluster's own age key, opened by its agent
at render (:mod:`agent.secrets.sops` the file format, :mod:`agent.secrets.keys` the cluster's
key pair, :mod:`agent.secrets.tree` the pass over a composed tree). See docs/secrets.md."""
