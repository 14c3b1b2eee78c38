"""The fleet repo: loading and validation (:mod:`hub.fleet.model`), label selectors
(:mod:`hub.fleet.selectors`), and per-cluster rendering (:mod:`hub.fleet.render`)."""

from hub.fleet.load import load_fleet
from hub.fleet.model import Bundle, Cluster, Fleet, Settings, SourceRef

__all__ = ["Bundle", "Cluster", "Fleet", "Settings", "SourceRef", "load_fleet"]
