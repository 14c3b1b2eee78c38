"""Rendering bundles into Kubernetes objects: safe manifest parsing, the ``plain`` format, the
format registry (plugins through the ``fleetlet.formats`` entry points) and ``fleetlet render``.
"""
