"""Session-wide fixtures: every real component is started once per session, on loopback."""

pytest_plugins = [
    "tests.realenv.kube_fixtures",
    "tests.realenv.registry_fixtures",
    "tests.realenv.git_fixtures",
    "tests.realenv.sigstore_fixtures",
    "tests.realenv.tool_fixtures",
    "tests.fleetlab",
]
