"""Importers: fleet repos written for other tools turned into fleetlet fleet repos
(``fleetlet import fleet``: Rancher Fleet's GitRepo layout, :mod:`hub.importer.fleet`)."""
