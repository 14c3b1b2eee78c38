"""The compressed soak (``pytest -m soak``); ``FLEETLET_SOAK_SECONDS`` sets its length."""
