"""A bundle's encrypted values (``formatOptions.encryptedValues``: a SOPS document the hub
carried whole from the fleet repo), opened for the format. Called by the render cache
(:meth:`agent.render.cache.RenderCache.render`) beside :func:`agent.secrets.tree.open_tree`.

With the cluster's keyring, the document is decrypted (MAC verified) and its values are merged
over ``formatOptions.values`` (mappings key by key, the encrypted value wins), and the format
is given those values and never the document: helm reads them on its stdin, so they are in no
file. Without one (the hub's previews) the encrypted strings are merged instead, and a render
shows them as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from agent.render.plain import RenderRequest
from agent.render.values import merge
from agent.secrets.sops import SopsError, is_sops_document, open_document

OPTION = "encryptedValues"
_WHERE = "formatOptions.encryptedValues"


def open_values(request: RenderRequest) -> tuple[RenderRequest, int]:
    """``request`` with its encrypted values merged into ``values`` (and the document gone),
    and how many values were decrypted (0: none, or left encrypted without a keyring).

    Raises SopsError naming the bundle and ``formatOptions.encryptedValues``.
    """
    document = request.options.get(OPTION)
    if document is None:
        return request, 0
    if not isinstance(document, Mapping) or not is_sops_document(document):
        raise SopsError(
            "not a SOPS document (a mapping with a sops block)",
            source=request.source,
            file=_WHERE,
            rule="SopsFormat",
        )
    keyring = request.keyring
    opened = 0
    if keyring is None:
        values: Any = {k: v for k, v in document.items() if k != "sops"}
    elif not keyring.identities:
        raise SopsError(
            f"this cluster's age key could not be read: {keyring.problem}",
            source=request.source,
            file=_WHERE,
            rule="NoClusterKey",
        )
    else:
        result = open_document(
            document,
            keyring.identities,
            recipients=keyring.recipients,
            source=request.source,
            file=_WHERE,
        )
        values, opened = result.document, result.values
    options = {k: v for k, v in request.options.items() if k != OPTION}
    options["values"] = merge(options.get("values") or {}, values)
    return dataclasses.replace(request, options=options), opened


__all__ = ["OPTION", "open_values"]
