"""Rendering bundles into Kubernetes objects: safe manifest parsing, the ``plain``, ``helm`` and
``kustomize`` formats, the format registry (plugins through the ``fleetlet.formats`` entry
points), post-render patches, format detection, the render cache, the cluster facts a render
depends on, the pinned external tools and the bounded child process they run in, and
``fleetlet render``.
"""
