"""Rendering bundles into Kubernetes objects: safe manifest parsing, the ``plain`` and ``helm``
formats, the format registry (plugins through the ``fleetlet.formats`` entry points), the
cluster facts a render depends on, the pinned external tools and the bounded child process they
run in, and ``fleetlet render``.
"""
