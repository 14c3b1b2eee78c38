"""The fleetlet hub: turns a fleet repo into signed per-cluster publications and reads status back.

The hub may import the agent's API types (``agent.api``); the agent never imports the hub.
"""
