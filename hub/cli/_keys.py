"""The bodies of the commands that hand out credentials: ``hub tokens add|migrate``,
``hub channel-token add`` and ``hub agent-key``. Registered by :mod:`hub.cli._parser`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hub.cli._context import UsageError


def _tokens_add(args: argparse.Namespace) -> int:
    from hub.api.tokens import add_token

    token = add_token(Path(args.file), name=args.name, role=args.role)
    print(token)
    print(
        f"token {args.name!r} ({args.role}) added to {args.file} (only its SHA-256 is kept): "
        "copy it now, it is not shown again",
        file=sys.stderr,
    )
    return 0


def _channel_token_add(args: argparse.Namespace) -> int:
    from hub.channel import add_channel_token

    print(add_channel_token(Path(args.file), args.cluster))
    print(
        f"channel token of {args.cluster} added to {args.file} (only its SHA-256 is kept): give "
        "it to that cluster's agent (--notify-token-file); it is not shown again",
        file=sys.stderr,
    )
    return 0


def _tokens_migrate(args: argparse.Namespace) -> int:
    from hub.api.tokens import migrate_tokens

    count = migrate_tokens(Path(args.file))
    if count:
        print(f"{args.file}: {count} tokens now stored as SHA-256 hashes (still valid)")
    else:
        print(f"{args.file}: already hashed, nothing to do")
    return 0


def _agent_key(args: argparse.Namespace) -> int:
    from agent.report.seal import agent_sealing_key, key_text, read_private_key

    key = agent_sealing_key(read_private_key(Path(args.hub_key)), args.cluster)
    try:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(key_text(key) + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write the sealing key to {args.out}: {exc}") from exc
    print(f"sealing key of cluster {args.cluster} written to {args.out}", file=sys.stderr)
    return 0
