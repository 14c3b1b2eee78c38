"""The ``fleetlet`` command: assembles the agent's and the hub's command trees."""
