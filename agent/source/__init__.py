"""Content sources of bundles: OCI artifacts, git commits and http archives, fetched by pin.

``ContentStore`` (``agent.source.compose``) is the entry point: it fetches each source through
the on-disk ``ContentCache`` and composes a bundle's tree. Every byte is checked against its
pin and unpacked with the hostile-input-safe extractor (``agent.source.archive``).
"""
