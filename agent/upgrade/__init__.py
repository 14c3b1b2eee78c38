"""The agent upgrading itself: its version comes with the set, and a new agent proves itself
before the old one stops acting.

- :mod:`agent.upgrade.desired`: the agent entry taken off a verified set (the bundles never
  see it), what the cluster wants and what the agent runs (a ConfigMap), and the entry's
  report in the status document, which the hub's rollout judges like a bundle's.
- :mod:`agent.upgrade.artifact`: an agent image as an OCI artifact (the agent's code and its
  ``fleetlet-agent.json``), packed, pulled by digest and unpacked.
- :mod:`agent.upgrade.lease`: the ``coordination.k8s.io`` Lease that says which agent acts.
- :mod:`agent.upgrade.process`: the upgrade pipeline of ``agent run`` (the acting agent starts
  the candidate, hands it the Lease once it checked itself, and takes it back, stopping the
  candidate, when it does not prove itself in time) and the candidate's self-check.
"""

from __future__ import annotations

AGENT_ENTRY = "fleetlet-agent"
"""The name and group of the agent's entry in a set (reserved: no bundle may take it)."""
AGENT_FORMAT = "fleetlet-agent"
"""The entry's format: never rendered; the agent takes the entry off before any render."""

__all__ = ["AGENT_ENTRY", "AGENT_FORMAT"]
