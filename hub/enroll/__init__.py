"""Enrolling clusters with a scoped bootstrap token (issue 30): :mod:`.tokens` (the tokens
file), :mod:`.service` (requests, acceptance, the inventory), :mod:`.routes` (its HTTP API),
:mod:`.command` (``hub enroll-token`` and ``hub clusters``). See docs/operations.md."""
