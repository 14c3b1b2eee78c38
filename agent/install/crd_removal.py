"""Removing a CustomResourceDefinition without meeting the API server's finalizer backoff.

Before it lets a CRD go, the API server's CRD finalizer lists the kind's objects (to delete
them). While the kind's watch cache is being built (on first use, which for a CRD nobody listed
is the finalizer's own list, and again when a sibling CRD of the same group changes or goes)
that list is refused ("storage is (re)initializing", 429); the finalizer then retries with a
backoff that doubles each time, and drops the CRD on a write conflict until its informer
resyncs, five minutes later. Several CRDs of one group deleted at once on an API server that
had never served them met that: fleetlet's four took up to five minutes to go.

:func:`remove_crd` lists the kind first, in one request: the API server builds its cache and
answers once the cache serves (a paged list would be read from etcd instead, cache or not).
Then it deletes the CRD and waits until it is gone, so that the next one is warmed and deleted
alone.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from agent.errors import TemporaryError
from agent.kube import ApiNotServedError, KubeClient, Object, ObjectRef

CRD_API_VERSION = "apiextensions.k8s.io/v1"


def crd_ref(name: str) -> ObjectRef:
    """The reference of CustomResourceDefinition ``name``."""
    return ObjectRef(CRD_API_VERSION, "CustomResourceDefinition", name, None)


def remove_crd(
    kube: KubeClient,
    name: str,
    *,
    deadline: float,
    delete: Callable[[ObjectRef], object] | None = None,
) -> bool:
    """Delete CRD ``name`` (through ``delete``, by default :meth:`KubeClient.delete`) and wait
    until the API server has removed it, with every object of its kind; True once it is gone,
    False when it is still there at ``deadline`` (a ``time.monotonic()`` value).

    Raises what :meth:`KubeClient.get` and ``delete`` raise (ForbiddenError...).
    """
    ref = crd_ref(name)
    live = kube.get(ref)
    if live is not None:
        _warm(kube, live, deadline)
    (delete or kube.delete)(ref)
    while kube.get(ref) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def remove_crds(
    kube: KubeClient,
    names: list[str],
    *,
    deadline: float,
    delete: Callable[[ObjectRef], object] | None = None,
) -> list[str]:
    """:func:`remove_crd` for each of ``names``, one after the other, every kind's cache started
    first (a paged list each: read from etcd, never refused, while the API server builds the
    caches side by side), so that each kind's own list then finds its cache ready and does not
    wait for a ``Retry-After``. Returns the names still there at ``deadline``."""
    for name in names:
        live = kube.get(crd_ref(name))
        kind = _kind(live) if live is not None else None
        if kind is not None:
            with contextlib.suppress(ApiNotServedError, TemporaryError):
                kube.list(*kind)
    return [n for n in names if not remove_crd(kube, n, deadline=deadline, delete=delete)]


def _kind(crd: Object) -> tuple[str, str] | None:
    """(apiVersion, kind) of the CRD's stored version."""
    spec = crd.get("spec") or {}
    versions = [v for v in spec.get("versions") or [] if v.get("storage")]
    kind = (spec.get("names") or {}).get("kind")
    if not versions or not kind or not spec.get("group"):
        return None
    return f"{spec['group']}/{versions[0]['name']}", str(kind)


def _warm(kube: KubeClient, crd: Object, deadline: float) -> None:
    """List the CRD's kind in one request, until the API server answers (see the module)."""
    kind = _kind(crd)
    if kind is None:
        return
    while True:
        try:
            kube.list(*kind, limit=None)
            return
        except ApiNotServedError:
            return  # not served (any more): the finalizer has nothing to list either
        except TemporaryError:
            if time.monotonic() > deadline:
                return  # delete anyway; the caller's wait says whether it went
            time.sleep(0.2)
