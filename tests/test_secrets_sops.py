"""SOPS files as the real ``sops`` binary writes them, opened by the agent's Python reader
(:mod:`agent.secrets`): the same values as ``sops --decrypt``, for YAML and JSON, every rule
sops encrypts by, several recipients; refusals that name the file (not a recipient, a tampered
value, a moved value, a stale MAC); the pass over a bundle tree, with and without a key.

The files are encrypted by sops v3.13.3, pinned and built from the Go module proxy like helm
(``tests/realenv/binaries.py``); keys are age X25519 keys made here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pyrage
import pytest
import yaml

from agent.render.manifests import load_documents
from agent.secrets.keys import Keyring, identity_text, parse_identities
from agent.secrets.sops import SopsError, open_document
from agent.secrets.tree import open_tree

PASSWORD = "pa55-Zebra-7781"

SECRET = f"""\
apiVersion: v1
kind: Secret
metadata:
  name: db
  namespace: shop
type: Opaque
stringData:
  password: {PASSWORD}
  port: "5432"
data:
  token: {__import__("base64").b64encode(b"tok-42").decode()}
"""

VALUES = f"""\
replicas: 2
database:
  host: db.shop
  password: {PASSWORD}
  port: 5432
  ratio: 0.25
  tls: true
  empty: ""
  nothing: null
  hosts:
    - a.example
    - b.example
  nested:
    - name: first
      key: one
plain_unencrypted: visible
"""


def make_key(directory: Path, name: str) -> tuple[Keyring, Path]:
    """A fresh age key: its keyring and its identity file (as age-keygen writes it)."""
    identity = pyrage.x25519.Identity.generate()
    from datetime import UTC, datetime

    path = directory / f"{name}.txt"
    path.write_text(identity_text(identity, created=datetime.now(UTC)))
    return parse_identities(path.read_text(), origin=str(path)), path


def sops(
    binary: Path, *args: str, cwd: Path, key_file: Path | None = None, stdin: str | None = None
) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOPS_")}
    if key_file is not None:
        env["SOPS_AGE_KEY_FILE"] = str(key_file)
    done = subprocess.run(
        [str(binary), *args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def encrypt(binary: Path, directory: Path, name: str, text: str, *args: str) -> Path:
    """``sops --encrypt [args] name`` (the file written in ``directory``), in place."""
    path = directory / name
    path.write_text(text)
    out = sops(binary, "--encrypt", *args, name, cwd=directory)
    path.write_text(out)
    return path


def opened(path: Path, keyring: Keyring) -> Any:
    document = load_documents(path.read_bytes(), source="bundle", file=path.name)[0]
    assert isinstance(document, dict)
    return open_document(
        document,
        keyring.identities,
        recipients=keyring.recipients,
        source="bundle",
        file=path.name,
    )


def sops_decrypted(binary: Path, path: Path, key_file: Path) -> Any:
    out = sops(binary, "--decrypt", path.name, cwd=path.parent, key_file=key_file)
    return json.loads(out) if path.name.endswith(".json") else yaml.safe_load(out)


@pytest.mark.parametrize(
    "rule",
    [
        [],
        ["--encrypted-regex", "^(data|stringData)$"],
        ["--unencrypted-regex", "^(apiVersion|kind|metadata|type)$"],
        ["--encrypted-suffix", "Data"],
        ["--unencrypted-suffix", "_unencrypted"],
        ["--mac-only-encrypted", "--encrypted-regex", "^(data|stringData)$"],
    ],
    ids=["all", "encrypted-regex", "unencrypted-regex", "encrypted-suffix", "unencrypted-suffix",
         "mac-only-encrypted"],
)  # fmt: skip
def test_a_secret_manifest_opens_to_what_sops_decrypts_under_every_rule(
    sops_binary: Path, tmp_path: Path, rule: list[str]
) -> None:
    keyring, key_file = make_key(tmp_path, "edge-1")
    path = encrypt(sops_binary, tmp_path, "secret.yaml", SECRET, "--age", keyring.current, *rule)
    assert PASSWORD not in path.read_text()
    result = opened(path, keyring)
    assert result.document == sops_decrypted(sops_binary, path, key_file)
    assert result.document["stringData"]["password"] == PASSWORD
    assert result.values >= 2


def test_values_of_every_type_in_yaml_and_json_open_as_sops_decrypts_them(
    sops_binary: Path, tmp_path: Path
) -> None:
    keyring, key_file = make_key(tmp_path, "edge-1")
    as_yaml = encrypt(sops_binary, tmp_path, "values.yaml", VALUES, "--age", keyring.current)
    as_json = encrypt(
        sops_binary,
        tmp_path,
        "values.json",
        json.dumps(yaml.safe_load(VALUES), indent=2),
        "--age",
        keyring.current,
    )
    for path in (as_yaml, as_json):
        result = opened(path, keyring)
        assert result.document == sops_decrypted(sops_binary, path, key_file), path.name
        database = result.document["database"]
        assert database["port"] == 5432 and database["ratio"] == 0.25 and database["tls"] is True
        assert database["empty"] == "" and database["nothing"] is None
        assert result.document["plain_unencrypted"] == "visible"


def test_a_file_for_several_recipients_by_creation_rules_opens_with_each_key(
    sops_binary: Path, tmp_path: Path
) -> None:
    one, _ = make_key(tmp_path, "edge-1")
    two, _ = make_key(tmp_path, "edge-2")
    (tmp_path / ".sops.yaml").write_text(
        yaml.safe_dump(
            {
                "creation_rules": [
                    {
                        "path_regex": r".*\.yaml$",
                        "encrypted_regex": "^(data|stringData)$",
                        "age": f"{one.current},{two.current}",
                    }
                ]
            }
        )
    )
    path = encrypt(sops_binary, tmp_path, "secret.yaml", SECRET)
    for keyring in (one, two):
        assert opened(path, keyring).document["stringData"]["password"] == PASSWORD


def test_a_file_for_other_clusters_is_refused_naming_the_file_and_both_recipients(
    sops_binary: Path, tmp_path: Path
) -> None:
    theirs, _ = make_key(tmp_path, "edge-1")
    mine, _ = make_key(tmp_path, "edge-3")
    path = encrypt(sops_binary, tmp_path, "secret.yaml", SECRET, "--age", theirs.current)
    with pytest.raises(SopsError) as caught:
        opened(path, mine)
    message = str(caught.value)
    assert caught.value.rule == "NotARecipient"
    assert "secret.yaml" in message and theirs.current in message and mine.current in message
    assert PASSWORD not in message


def _tampered(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_tampering_is_refused_with_the_file_named_never_the_value(
    sops_binary: Path, tmp_path: Path
) -> None:
    keyring, _ = make_key(tmp_path, "edge-1")
    args = ("--age", keyring.current, "--encrypted-regex", "^(data|stringData)$")
    cases = {
        # An unencrypted field the MAC covers (the namespace the Secret lands in).
        "unencrypted": lambda p: _tampered(p, "namespace: shop", "namespace: kube-system"),
        # An encrypted value moved to another key: its path is its additional data.
        "moved": lambda p: p.write_text(_swap_values(p.read_text(), "password", "port")),
        # A value removed: the MAC no longer matches.
        "removed": lambda p: p.write_text(
            "\n".join(line for line in p.read_text().splitlines() if "port:" not in line) + "\n"
        ),
    }
    for name, tamper in cases.items():
        path = encrypt(sops_binary, tmp_path, f"{name}.yaml", SECRET, *args)
        tamper(path)
        with pytest.raises(SopsError) as caught:
            opened(path, keyring)
        assert caught.value.rule == "MacMismatch", name
        assert f"{name}.yaml" in str(caught.value) and PASSWORD not in str(caught.value)


def _swap_values(text: str, a: str, b: str) -> str:
    lines = text.splitlines()
    ia = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{a}:"))
    ib = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{b}:"))
    va, vb = lines[ia].split(": ", 1)[1], lines[ib].split(": ", 1)[1]
    lines[ia] = lines[ia].split(": ", 1)[0] + ": " + vb
    lines[ib] = lines[ib].split(": ", 1)[0] + ": " + va
    return "\n".join(lines) + "\n"


def test_a_rotated_keyring_opens_files_for_the_old_and_the_new_key(
    sops_binary: Path, tmp_path: Path
) -> None:
    old, old_file = make_key(tmp_path, "old")
    new, new_file = make_key(tmp_path, "new")
    both = parse_identities(new_file.read_text() + old_file.read_text(), origin="keys.txt")
    assert both.current == new.current and both.recipients[1] == old.current
    for keyring, name in ((old, "old.yaml"), (new, "new.yaml")):
        path = encrypt(sops_binary, tmp_path, name, SECRET, "--age", keyring.current)
        assert opened(path, both).document["stringData"]["password"] == PASSWORD


def test_a_tree_is_opened_in_place_with_a_key_and_only_counted_without(
    sops_binary: Path, tmp_path: Path
) -> None:
    keyring, _ = make_key(tmp_path, "edge-1")
    tree = tmp_path / "tree"
    (tree / "chart").mkdir(parents=True)
    (tree / "01_ns.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n")
    encrypt(sops_binary, tree, "02_secret.yaml", SECRET, "--age", keyring.current,
            "--encrypted-regex", "^(data|stringData)$")  # fmt: skip
    encrypt(sops_binary, tree / "chart", "values-prod.yaml", VALUES, "--age", keyring.current)
    counted = open_tree(tree, None, source="shop")
    assert counted.files == {"02_secret.yaml": 3, "chart/values-prod.yaml": 10}
    assert not counted.opened and PASSWORD not in (tree / "02_secret.yaml").read_text()
    found = open_tree(tree, keyring, source="shop")
    assert found.opened and found.files == counted.files
    assert yaml.safe_load((tree / "02_secret.yaml").read_text())["stringData"] == {
        "password": PASSWORD,
        "port": "5432",
    }
    assert "sops" not in yaml.safe_load((tree / "chart" / "values-prod.yaml").read_text())
    assert (tree / "02_secret.yaml").stat().st_mode & 0o077 == 0
    assert open_tree(tree, keyring, source="shop").files == {}  # nothing left encrypted


def test_a_cluster_without_a_usable_key_fails_the_file_naming_why(
    sops_binary: Path, tmp_path: Path
) -> None:
    keyring, _ = make_key(tmp_path, "edge-1")
    tree = tmp_path / "tree"
    tree.mkdir()
    encrypt(sops_binary, tree, "secret.yaml", SECRET, "--age", keyring.current)
    broken = Keyring(identities=(), recipients=(), problem="Secret x/fleetlet-age-key: no keys")
    with pytest.raises(SopsError) as caught:
        open_tree(tree, broken, source="shop")
    assert caught.value.rule == "NoClusterKey" and "secret.yaml" in str(caught.value)
    assert "no keys" in str(caught.value)


def test_a_dotenv_file_opens_to_what_sops_decrypts_and_refuses_tampering(
    sops_binary: Path, tmp_path: Path
) -> None:
    keyring, key_file = make_key(tmp_path, "edge-1")
    tree = tmp_path / "tree"
    tree.mkdir()
    text = f"# the database\nDB_PASSWORD={PASSWORD}\nDB_USER=app\nMULTI=one\\ntwo\n"
    path = encrypt(sops_binary, tree, "db.env", text, "--age", keyring.current)
    assert PASSWORD not in path.read_text()
    expected = sops(sops_binary, "--decrypt", "db.env", cwd=tree, key_file=key_file)
    assert open_tree(tree, None, source="shop").files == {"db.env": 3}
    assert open_tree(tree, keyring, source="shop").files == {"db.env": 3}
    opened_lines = [line for line in path.read_text().splitlines() if line]
    assert opened_lines == [line for line in expected.splitlines() if line and line[0] != "#"]

    again = encrypt(sops_binary, tree, "db.env", text, "--age", keyring.current)
    _tampered(again, "DB_USER=", "DB_ADMIN=")
    with pytest.raises(SopsError) as caught:
        open_tree(tree, keyring, source="shop")
    assert caught.value.rule == "MacMismatch" and "db.env" in str(caught.value)


def test_a_preview_shows_which_encrypted_values_changed_never_a_value(
    sops_binary: Path, tmp_path: Path
) -> None:
    """What ``hub diff --cluster`` shows of a SOPS Secret it cannot open: ``sops set`` keeps
    the ciphertext of the values it does not change."""
    from agent.approve.diff import ENCRYPTED, ENCRYPTED_CHANGED, redacted, unified

    keyring, key_file = make_key(tmp_path, "edge-1")
    path = encrypt(sops_binary, tmp_path, "secret.yaml", SECRET, "--age", keyring.current,
                   "--encrypted-regex", "^(data|stringData)$")  # fmt: skip
    before = load_documents(path.read_bytes(), source="b", file="secret.yaml")[0]
    sops(sops_binary, "set", "secret.yaml", '["stringData"]["password"]', '"n3w-Otter-9"',
         cwd=tmp_path, key_file=key_file)  # fmt: skip
    after = load_documents(path.read_bytes(), source="b", file="secret.yaml")[0]
    assert isinstance(before, dict) and isinstance(after, dict)
    old, new = redacted(before, after)
    assert old is not None and new is not None and "sops" not in new and "sops" not in old
    assert new["stringData"] == {"password": ENCRYPTED_CHANGED, "port": ENCRYPTED}
    assert new["data"] == {"token": ENCRYPTED} and new["metadata"] == before["metadata"]
    shown = unified(old, new, old="published", new="new")
    assert "<encrypted: changed>" in shown and "ENC[" not in shown and "n3w-Otter-9" not in shown
