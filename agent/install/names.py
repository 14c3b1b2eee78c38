"""Names the installation's flags and manifests share (kept apart so that the flags import
nothing heavy)."""

DEFAULT_NAMESPACE = "fleetlet-system"
"""The agent's namespace unless ``--namespace`` says otherwise."""
