"""The whole environment each renderer runs with: nothing of the agent's (no token, no
credentials, no proxy), a home where nothing can exist. Part of :mod:`agent.render.confine`
(which re-exports it), kept apart and lean so that ``fleetlet render``'s head start
(:mod:`agent.render.headstart`) can start helm or kustomize before the rest loads.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing itself is not imported: it costs ~2 ms at start
if TYPE_CHECKING:
    from collections.abc import Mapping

    StrPath = str | os.PathLike[str]

_NOWHERE = "http://127.0.0.1:9"
# Every proxy variable a Go or Python tool reads, at a closed local port.
_NO_PROXY: Mapping[str, str] = {
    "HTTP_PROXY": _NOWHERE,
    "HTTPS_PROXY": _NOWHERE,
    "http_proxy": _NOWHERE,
    "https_proxy": _NOWHERE,
    "NO_PROXY": "",
    "no_proxy": "",
}


# helm's whole environment: no cluster, no network, and no state. Its home and every ``HELM_*``
# directory lie under /dev/null, a file, so nothing there can be read or created (not even by
# root): no repositories, no registry logins, no plugins (so no post-renderer), no cache shared
# between renders. The registry configuration is /dev/null itself, because helm opens it on
# every start and takes "not a directory" for an error.
_HELM_NO_STATE = "/dev/null/fleetlet-helm"
HELM_ENVIRONMENT: Mapping[str, str] = {
    "PATH": "/usr/bin:/bin",
    "HOME": _HELM_NO_STATE,
    "HELM_CACHE_HOME": f"{_HELM_NO_STATE}/cache",
    "HELM_CONFIG_HOME": f"{_HELM_NO_STATE}/config",
    "HELM_DATA_HOME": f"{_HELM_NO_STATE}/data",
    "HELM_PLUGINS": f"{_HELM_NO_STATE}/plugins",
    "HELM_REGISTRY_CONFIG": "/dev/null",
    "HELM_REPOSITORY_CONFIG": f"{_HELM_NO_STATE}/config/repositories.yaml",
    "HELM_REPOSITORY_CACHE": f"{_HELM_NO_STATE}/cache/repository",
    "KUBECONFIG": f"{_HELM_NO_STATE}/kubeconfig",
    **_NO_PROXY,
}


def environment(
    *, scratch: StrPath | None, home: str = "/dev/null/fleetlet-render"
) -> dict[str, str]:
    """A renderer's whole environment (kustomize passes it on to helm): ``PATH``, temporary
    files in ``scratch``, a home under ``/dev/null`` where nothing can exist, proxies at a
    closed local port; nothing of the agent's (no token, no credentials)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": home,
        "XDG_CONFIG_HOME": home,
        **_NO_PROXY,
    }
    if scratch is not None:
        env["TMPDIR"] = os.fspath(scratch)
    return env


__all__ = ["HELM_ENVIRONMENT", "environment"]
