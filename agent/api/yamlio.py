"""PyYAML's safe loader and dumper, in C when libyaml is there: the one choice every YAML
reader and writer of fleetlet makes (bounds on what they read are theirs)."""

from __future__ import annotations

import yaml

SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SAFE_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

__all__ = ["SAFE_DUMPER", "SAFE_LOADER"]
