"""``fleetlet health -f FILE``: the kstatus-style health of the objects named in a file.

By default each object of the file is looked up in the cluster (kubeconfig: ``--kubeconfig``,
else ``$KUBECONFIG`` or ``~/.kube/config``, else the in-cluster configuration) and its live
state is assessed, exactly as the agent assesses it. With ``offline=True`` the objects are
assessed as written, which suits the output of ``kubectl get -o yaml`` saved earlier.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from agent.api.yamlio import KUBE_LOADER
from agent.errors import PermanentError
from agent.health import ObjectHealth, assess, assess_live
from agent.health.kstatus import Status
from agent.output import OUTPUT_FORMATS, render, table

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
_MAX_FILE_BYTES = 16 * 1024 * 1024


class HealthInputError(PermanentError):
    """The file cannot be read or holds something other than Kubernetes objects."""

    reason = "InvalidInput"


def _documents(filename: str) -> Iterator[Mapping[str, Any]]:
    path = Path(filename)
    try:
        if path.stat().st_size > _MAX_FILE_BYTES:
            raise HealthInputError(f"{filename}: larger than {_MAX_FILE_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HealthInputError(f"{filename}: cannot read: {exc}") from exc
    try:
        documents = list(yaml.load_all(text, Loader=KUBE_LOADER))
    except yaml.YAMLError as exc:
        raise HealthInputError(f"{filename}: not YAML: {exc}") from exc
    for index, document in enumerate(documents, start=1):
        if document is None:
            continue
        if not isinstance(document, Mapping):
            raise HealthInputError(f"{filename}: document {index} is not an object")
        kind = document.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and "items" in document:
            # `kubectl get -o yaml` of several objects.
            items = document.get("items") or []
            if not isinstance(items, list):
                raise HealthInputError(f"{filename}: document {index}: items is not a list")
            for item in items:
                if isinstance(item, Mapping):
                    yield item
            continue
        yield document


def _objects(filename: str) -> list[Mapping[str, Any]]:
    objects = []
    for number, obj in enumerate(_documents(filename), start=1):
        meta = obj.get("metadata")
        if not (
            isinstance(obj.get("apiVersion"), str)
            and isinstance(obj.get("kind"), str)
            and isinstance(meta, Mapping)
            and isinstance(meta.get("name"), str)
        ):
            raise HealthInputError(
                f"{filename}: object {number} needs apiVersion, kind and metadata.name"
            )
        objects.append(obj)
    return objects


def _with_namespaces(objects: list[Mapping[str, Any]], kube: Any) -> list[Mapping[str, Any]]:
    # Like kubectl: a namespaced object written without a namespace lives in `default`.
    out: list[Mapping[str, Any]] = []
    for obj in objects:
        meta = obj["metadata"]
        if not meta.get("namespace") and kube.scope(obj["apiVersion"], obj["kind"]):
            obj = {**obj, "metadata": {**meta, "namespace": "default"}}
        out.append(obj)
    return out


def _table(results: list[ObjectHealth]) -> str:
    return table(
        [(r.name, str(r.status), r.assessment.message) for r in results],
        ["OBJECT", "STATUS", "MESSAGE"],
    )


def run_health(
    *,
    filename: str,
    output: str,
    kubeconfig: str | None = None,
    context: str | None = None,
    offline: bool = False,
    discovery_cache_dir: str | Path | None = None,
) -> tuple[str, int]:
    """Assess every object in ``filename``; return the text to print and the exit code
    (0 when every object is Current, 1 otherwise). ``output``: ``table``, ``json`` or ``yaml``.

    Raises HealthInputError (unreadable file, not objects), KubeconfigError, and the KubeErrors
    of reading the cluster (ApiUnavailableError when it cannot be reached).
    """
    if output not in OUTPUT_FORMATS:
        raise HealthInputError(f"unknown output format {output!r} (table, json or yaml)")
    objects = _objects(filename)
    if offline:
        from agent.kube import ObjectRef

        results = [ObjectHealth(ObjectRef.of(obj), assess(obj)) for obj in objects]
    else:
        from agent.kube import ApiUnavailableError, KubeClient, KubeconfigError

        config = kubeconfig  # already found as kubectl finds it (agent.options.kubeconfig_of)
        if config is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise KubeconfigError(
                "no cluster to read the objects from: no --kubeconfig, no $KUBECONFIG, no "
                "~/.kube/config, and not running in a pod. Give --kubeconfig FILE, or --offline "
                "to assess the objects as written in the file"
            )
        try:
            with KubeClient(
                kubeconfig=config, context=context, discovery_cache_dir=discovery_cache_dir
            ) as kube:
                results = assess_live(kube, _with_namespaces(objects, kube))
        except ApiUnavailableError as exc:
            where = f"kubeconfig {config}" if config else "the in-cluster configuration"
            raise ApiUnavailableError(
                f"{exc}. Is the cluster of {where} up? (--offline assesses the objects as "
                "written, without a cluster)",
                target=exc.target,
                status=exc.status,
            ) from exc
    code = EXIT_HEALTHY if all(r.status is Status.CURRENT for r in results) else EXIT_UNHEALTHY
    if output == "table":
        return _table(results), code
    return render([r.to_dict() for r in results], output, table=str, sort_keys=False), code
