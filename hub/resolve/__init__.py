"""Pinning fleet sources to digests: see :mod:`hub.resolve.resolver`."""

from hub.resolve.resolver import Resolver, ResolveSettings, split_oci_uri

__all__ = ["ResolveSettings", "Resolver", "split_oci_uri"]
