"""The fleetlet agent: pulls, verifies, renders and applies its cluster's BundleDeployment set.

The agent owns the contract between hub and agent (``agent.api``): the hub imports those types,
the agent never imports the hub.
"""

__version__ = "0.1.0"
