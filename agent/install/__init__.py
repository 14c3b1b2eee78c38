"""Putting a cluster into a fleet: ``fleetlet agent install`` and ``fleetlet agent uninstall``.

- :mod:`agent.install.manifests`: every object of an installation (also written to
  ``deploy/agent/`` as the kustomize base);
- :mod:`agent.install.installer`: applying them idempotently, and removing them;
- :mod:`agent.install.command`: the command line.
"""
