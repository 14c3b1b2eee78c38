"""Publishing: sign a whole publication once and lay out each cluster's branch files.

The names below are imported on first use: importing one module of this package (the shard
layout, the git plumbing) does not load the signing code and Sigstore with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hub.publish.sign import (
        ClusterPublication,
        Publication,
        PublicationSigner,
        sign_publication,
    )

_WHERE = {
    "ClusterPublication": "hub.publish.sign",
    "Publication": "hub.publish.sign",
    "PublicationSigner": "hub.publish.sign",
    "sign_publication": "hub.publish.sign",
}

__all__ = ["ClusterPublication", "Publication", "PublicationSigner", "sign_publication"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'hub.publish' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
