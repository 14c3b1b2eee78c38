"""The hub's ``credentialsCommand`` for the test git HTTP server (docs/operations.md,
"Enrollment"): ``python -m tests.realenv.git_issuer USERS_FILE CLUSTER`` adds a user named
after the cluster and prints the credentials the hub seals to the cluster's key. What that user
may push is the repositories' pre-receive hooks' business ("Who may push what")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.realenv.gitserver import add_user


def main(argv: list[str]) -> int:
    users_file, cluster = Path(argv[0]), argv[1]
    password = add_user(users_file, cluster)
    credential = {"username": cluster, "password": password}
    print(json.dumps({"git": credential, "statusGit": credential}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
