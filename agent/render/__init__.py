"""Rendering bundles into Kubernetes objects: safe manifest parsing, the ``plain`` and
``kustomize`` formats, the format registry (plugins through the ``fleetlet.formats`` entry
points), post-render patches, format detection, the render cache and ``fleetlet render``.
"""
