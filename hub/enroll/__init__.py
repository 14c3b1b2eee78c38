"""Enrolling clusters with a scoped bootstrap token (issue 30): :mod:`.tokens` (the tokens
file), :mod:`.service` (requests, acceptance, the inventory), :mod:`.signed` (a request signed
by the cluster's key, fresh, seen once), :mod:`.policy` (a token's CEL policy), :mod:`.routes`
(its HTTP API, declared in :mod:`hub.api.endpoints`), :mod:`.command` (``hub enroll-token`` and ``hub
clusters``), :mod:`.refused` (its one error). See docs/operations.md."""
