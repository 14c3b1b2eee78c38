"""Session-wide fixtures: every real component is started once per session, on loopback.

With pytest-xdist (``scripts/test.sh`` runs the default tier with ``-n 4 --dist loadfile``) a
session is one worker: each worker starts its own control plane, git servers, registries and
Sigstore on ports the OS picks, under its own ``tmp_path_factory`` directory. ``loadfile``
keeps each file on one worker, in order, so a module-scoped fixture is built once and the tests
that build on each other's state keep their order; a new test file needs nothing more.
(``--dist loadgroup`` would place tests by ``xdist_group`` marks, but pytest-xdist 3.8 marks
the group by rewriting ``item._nodeid``, which pytest 9.2 no longer reads: the marks are
ignored and every test is scheduled alone.)
"""

pytest_plugins = [
    "tests.realenv.kube_fixtures",
    "tests.realenv.registry_fixtures",
    "tests.realenv.git_fixtures",
    "tests.realenv.sigstore_fixtures",
    "tests.realenv.tool_fixtures",
    "tests.fleetlab",
]
