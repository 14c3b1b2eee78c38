"""The answers about the fleet, as JSON-ready documents: shared by the hub API and the CLI.

:class:`StatusQueries` answers over a :class:`~hub.status.FleetStatus`; sealed outputs are
opened with the hub's private key only when asked as admin, shown as ``<sensitive>``
otherwise. No web framework here, so ``fleetlet installations --repo`` runs without the hub
extra.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nacl.public import PrivateKey

from agent.report.seal import SealError, open_sealed, read_private_key
from hub.status.aggregate import STATES, FleetStatus

SENSITIVE = "<sensitive>"

Opener = Callable[[str], str]


def load_private_key(path: Path) -> PrivateKey:
    """The hub's X25519 private key (base64 of 32 raw bytes, one line).

    Raises HubKeyError (a PermanentError) naming the file.
    """
    return read_private_key(Path(path))


def sealed_opener(private_key: PrivateKey) -> Opener:
    """Open base64 sealed boxes with ``private_key``; the function raises ValueError on a box
    that does not open (sealed to another key, damaged)."""

    def open_value(sealed: str) -> str:
        try:
            return open_sealed(private_key, sealed)
        except SealError as exc:
            raise ValueError(str(exc)) from exc

    return open_value


def present_outputs(
    outputs: Mapping[str, Any], *, admin: bool, opener: Opener | None
) -> list[dict[str, Any]]:
    """Outputs as ``{name, value, sensitive}`` rows: sealed values opened for admins only."""
    rows = []
    for name, item in sorted(outputs.items()):
        item = item if isinstance(item, dict) else {}
        if "value" in item:
            rows.append({"name": name, "value": item["value"], "sensitive": False})
        elif "sealed" in item:
            value: Any = SENSITIVE
            if admin:
                if opener is None:
                    value = "<sealed: the hub has no private key>"
                else:
                    try:
                        value = opener(str(item["sealed"]))
                    except ValueError:
                        value = "<sealed: does not open with the hub key>"
            rows.append({"name": name, "value": value, "sensitive": True})
        else:
            # Omitted by the agent (it has no hub key): there is no value anywhere outside.
            rows.append({"name": name, "value": None, "sensitive": True, "omitted": True})
    return rows


class QueryError(Exception):
    """A query the view cannot answer: ``status`` is the HTTP status (400, 404)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class StatusQueries:
    """The answers of the API, as JSON-ready dicts; shared by the API and the CLI's ``--repo``.

    Each method raises QueryError (404 for an unknown cluster, bundle or run; 400 for a bad
    filter). ``admin`` decides whether sealed outputs are opened.
    """

    def __init__(self, status: FleetStatus, *, opener: Opener | None = None) -> None:
        self.status = status
        self.opener = opener

    def clusters(self) -> dict[str, Any]:
        return {"items": self.status.clusters()}

    def cluster(self, name: str) -> dict[str, Any]:
        found = self.status.cluster(name)
        if found is None:
            raise QueryError(404, f"unknown cluster {name!r}")
        return found

    def installations(
        self, *, cluster: str | None = None, bundle: str | None = None, state: str | None = None
    ) -> dict[str, Any]:
        if state is not None and state not in STATES:
            raise QueryError(400, f"state must be one of {', '.join(STATES)}, got {state!r}")
        items = self.status.installations(cluster=cluster, bundle=bundle, state=state)
        return {"items": items}

    def _missing(self, cluster: str, bundle: str) -> QueryError:
        if self.status.cluster(cluster) is None:
            return QueryError(404, f"unknown cluster {cluster!r}")
        return QueryError(404, f"cluster {cluster!r} has no installation of bundle {bundle!r}")

    def installation(self, cluster: str, bundle: str, *, admin: bool) -> dict[str, Any]:
        detail = self.status.installation(cluster, bundle)
        if detail is None:
            raise self._missing(cluster, bundle)
        detail["runs"] = [self._run_view(r, admin=admin) for r in detail["runs"]]
        return detail

    def runs(self, cluster: str, bundle: str, *, admin: bool) -> dict[str, Any]:
        found = self.status.runs(cluster, bundle)
        if found is None:
            raise self._missing(cluster, bundle)
        items = [self._run_view(r, admin=admin) for r in found]
        return {"installation": f"{cluster}/{bundle}", "items": items}

    def outputs(self, cluster: str, bundle: str, run_id: str, *, admin: bool) -> dict[str, Any]:
        if self.status.runs(cluster, bundle) is None:
            raise self._missing(cluster, bundle)
        run = self.status.run(cluster, bundle, run_id)
        if run is None:
            what = "no succeeded run" if run_id == "latest" else f"no run {run_id!r}"
            raise QueryError(404, f"installation {cluster}/{bundle} has {what}")
        rows = present_outputs(run.get("outputs") or {}, admin=admin, opener=self.opener)
        return {
            "installation": f"{cluster}/{bundle}",
            "run": run["id"],
            "result": run.get("result"),
            "items": rows,
        }

    def _run_view(self, run: Mapping[str, Any], *, admin: bool) -> dict[str, Any]:
        shown = dict(run)
        shown["outputs"] = present_outputs(
            run.get("outputs") or {}, admin=admin, opener=self.opener
        )
        return shown
