"""Where a commit landed: commit statuses on the fleet repo's commits and alerts to webhooks,
from what ``hub serve`` sees (docs/operations.md, "Commit statuses and alerts").

    rollouts, status view -> statuses and alerts -> deduplicated -> delivered (retried, rate limited)

- **Commit statuses**, one per rollout (context ``fleetlet/<group>``) on the fleet commit it
  carries out: ``pending`` while it moves, ``success`` once Completed (every member Ready on
  the new revision), ``failure`` when Halted or Reverted (the failed clusters named), with the
  counts. To GitHub, Gitea (the same API) or GitLab. A group published without a rollout
  strategy gets none (a publication records no per-cluster commit to judge it by).
- **Alerts**, one per event: a rollout halted (with its failed clusters), an installation
  rolled back that no halted rollout already names, an approval requested, clusters gone
  stale; to webhooks as generic JSON (HMAC-SHA256 signed when a secret is given), Slack or
  Microsoft Teams.

Each status or alert is sent once per state (a key and a digest of what it says, kept in
memory: a restarted hub sends the current ones again). Delivery runs in one thread: a failed
send (connection, 5xx, 429) is tried again after 1, 2, 4... seconds up to :data:`ATTEMPTS`
times (``Retry-After`` honoured up to a minute); at most :data:`PER_MINUTE` sends per target
and minute, the rest wait their turn.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from agent.errors import FleetletError, PermanentError
from hub.serve_options import add_notify_arguments

log = logging.getLogger(__name__)

ATTEMPTS = 5
PER_MINUTE = 30
MAX_NAMES = 10
StatusKind = Literal["github", "gitea", "gitlab"]
AlertFormat = Literal["json", "slack", "teams"]
DEFAULT_API = {"github": "https://api.github.com", "gitlab": "https://gitlab.com/api/v4"}
SIGNATURE_HEADER = "X-Fleetlet-Signature-256"


class NotifyConfigError(PermanentError):
    """A commit-status or alert option that cannot work (format, file, URL)."""


# --- what to say ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommitStatus:
    sha: str
    context: str
    state: Literal["pending", "success", "failure"]
    description: str


@dataclass(frozen=True, slots=True)
class Alert:
    key: str
    kind: Literal["rollout-halted", "rolled-back", "approval-requested", "clusters-stale"]
    title: str
    text: str
    fields: Mapping[str, Any] = field(default_factory=dict)


def commit_statuses(rollouts: Iterable[Mapping[str, Any]]) -> list[CommitStatus]:
    """One status per rollout summary (:func:`hub.rollout.report.summary`) on a real commit
    (a fleet directory outside git has a digest of its files instead: skipped)."""
    out = []
    state: Literal["pending", "success", "failure"]
    for r in rollouts:
        sha = str(r["source"]["commit"])
        if r["status"] == "Superseded" or len(sha) != 40:
            continue
        counts, total = r["counts"], r["clusters"]
        ready = f"{counts.get('passed', 0)}/{total} clusters Ready"
        if r["status"] == "Completed":
            state, text = "success", f"{ready} on it"
        elif r["status"] in ("Halted", "Reverted"):
            failures = sorted((r.get("halt") or {}).get("failures") or {})
            named = ", ".join(failures[:3]) + (" ..." if len(failures) > 3 else "")
            state, text = "failure", f"{r['status'].lower()}: {named or 'see the rollout'}; {ready}"
        elif r["status"] == "Aborted":
            state, text = "failure", f"aborted; {ready}"
        else:
            wave = f", wave {r['currentWave']}" if r.get("currentWave") else ""
            state, text = (
                "pending",
                f"{r['status']}{wave}: {ready}, {counts.get('failed', 0)} failed",
            )
        out.append(
            CommitStatus(
                sha=sha, context=f"fleetlet/{r['group']}", state=state, description=text[:140]
            )
        )
    return out


def _names(names: Sequence[str]) -> str:
    more = len(names) - MAX_NAMES
    return ", ".join(names[:MAX_NAMES]) + (f" and {more} more" if more > 0 else "")


def alerts(
    rollouts: Iterable[Mapping[str, Any]],
    rolled_back: Iterable[Mapping[str, Any]],
    approvals: Iterable[Mapping[str, Any]],
    clusters: Iterable[Mapping[str, Any]],
    moving: Mapping[str, AbstractSet[str]] | None = None,
) -> list[Alert]:
    """The alerts of this moment: halted rollouts (summaries), rolled-back installations
    (summaries), pending approval requests (``cluster`` and a request of the status document)
    and stale clusters (cluster summaries).

    An installation rolled back on a cluster that a rollout of its group still moves
    (``moving``: group -> clusters) or that a halt names is that rollout's to report: its
    commit status counts the failure, and past the budget its halt is the alert."""
    moving = moving or {}
    out = []
    halted: set[str] = set()
    for r in rollouts:
        halt = r.get("halt")
        if r["status"] not in ("Halted", "Reverted") or not halt:
            continue
        failures = dict(halt.get("failures") or {})
        halted.update(failures)
        out.append(
            Alert(
                key=f"halted/{r['id']}/{halt['at']}",
                kind="rollout-halted",
                title=f"Rollout {r['id']} of group {r['group']} {r['status'].lower()}",
                text=f"{halt['reason']}. Failed: {_names(sorted(failures)) or 'none named'}. "
                f"Fleet commit {str(r['source']['commit'])[:12]}; "
                f"`fleetlet hub rollout resume {r['id']}` or `abort`.",
                fields={"rollout": r["id"], "group": r["group"], "failures": failures},
            )
        )
    for i in rolled_back:
        if i["cluster"] in halted or i["cluster"] in moving.get(str(i.get("group")), ()):
            continue
        run = i.get("lastRun") or {}
        out.append(
            Alert(
                key=f"rolled-back/{i['name']}/{run.get('id')}",
                kind="rolled-back",
                title=f"{i['name']} rolled back",
                text=f"Group {i.get('group')} went back to its previous revision (run "
                f"{run.get('id')}); `fleetlet explain {i['cluster']} {i['bundle']}`.",
                fields={"cluster": i["cluster"], "bundle": i["bundle"], "run": run.get("id")},
            )
        )
    for a in approvals:
        request = a["request"]
        out.append(
            Alert(
                key=f"approval/{a['cluster']}/{request['name']}",
                kind="approval-requested",
                title=f"{a['cluster']}: approval requested for group {request.get('group')}",
                text=f"Request {request['name']} (serial {request.get('serial')}, "
                f"{(request.get('preview') or {}).get('findings', 0)} security findings): "
                f"`fleetlet preview {request['name']}`, then approve or deny.",
                fields={"cluster": a["cluster"], "request": request["name"]},
            )
        )
    stale = sorted((c for c in clusters if c.get("stale")), key=lambda c: str(c["name"]))
    if stale:
        names = [str(c["name"]) for c in stale]
        beats = hashlib.sha256(
            "".join(f"{c['name']}@{c.get('heartbeat')}" for c in stale).encode()
        ).hexdigest()[:16]
        out.append(
            Alert(
                key=f"stale/{beats}",
                kind="clusters-stale",
                title=f"{len(names)} cluster{'' if len(names) == 1 else 's'} gone stale",
                text=f"No report for longer than the hub's --stale-after: {_names(names)}.",
                fields={"clusters": names},
            )
        )
    return out


# --- where to say it ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    url: str
    body: bytes
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class StatusTarget:
    """``--commit-status KIND:REPO`` (``owner/name``, or GitLab's project path)."""

    kind: StatusKind
    api: str
    repo: str
    token: str
    target_url: str | None = None

    def request(self, status: CommitStatus) -> Request:
        api = self.api.rstrip("/")
        if self.kind == "gitlab":
            project = urllib.parse.quote(self.repo, safe="")
            state = {"pending": "running", "success": "success", "failure": "failed"}
            body: dict[str, Any] = {
                "state": state[status.state],
                "name": status.context,
                "description": status.description,
            }
            headers = {"PRIVATE-TOKEN": self.token}
            url = f"{api}/projects/{project}/statuses/{status.sha}"
        else:
            body = {
                "state": status.state,
                "context": status.context,
                "description": status.description,
            }
            scheme = "Bearer" if self.kind == "github" else "token"
            headers = {"Authorization": f"{scheme} {self.token}"}
            if self.kind == "github":
                headers["Accept"] = "application/vnd.github+json"
            url = f"{api}/repos/{self.repo}/statuses/{status.sha}"
        if self.target_url:
            body["target_url"] = self.target_url
        return Request(url=url, body=json.dumps(body).encode(), headers=headers)


@dataclass(frozen=True, slots=True)
class Webhook:
    """``--alert-webhook FORMAT:URL`` (``FORMAT:@FILE``: the URL, a secret, read from FILE)."""

    format: AlertFormat
    url: str
    secret: bytes | None = None

    def request(self, alert: Alert) -> Request:
        if self.format == "slack":
            payload: dict[str, Any] = {"text": f"*{alert.title}*\n{alert.text}"}
        elif self.format == "teams":
            payload = {
                "@type": "MessageCard",
                "@context": "https://schema.org/extensions",
                "summary": alert.title,
                "title": alert.title,
                "text": alert.text,
            }
        else:
            payload = {
                "kind": alert.kind,
                "key": alert.key,
                "title": alert.title,
                "text": alert.text,
                "fields": dict(alert.fields),
            }
        body = json.dumps(payload, sort_keys=True).encode()
        headers = {}
        if self.secret is not None:
            digest = hmac.new(self.secret, body, hashlib.sha256).hexdigest()
            headers[SIGNATURE_HEADER] = f"sha256={digest}"
        return Request(url=self.url, body=body, headers=headers)


def _read_secret(path: str, what: str) -> str:
    try:
        value = Path(path).read_text().strip()
    except OSError as exc:
        raise NotifyConfigError(f"{what} {path}: {exc.strerror}") from exc
    if not value:
        raise NotifyConfigError(f"{what} {path}: empty")
    return value


def status_target(
    spec: str, *, api: str | None, token_file: str | None, target_url: str | None
) -> StatusTarget:
    """``KIND:REPO`` with its API URL and token file. Raises NotifyConfigError."""
    kind, sep, repo = spec.partition(":")
    if not sep or kind not in ("github", "gitea", "gitlab") or not repo:
        raise NotifyConfigError(
            f"--commit-status {spec!r}: expected github:OWNER/NAME, gitea:OWNER/NAME or "
            "gitlab:GROUP/PROJECT"
        )
    base = api or DEFAULT_API.get(kind)
    if not base:
        raise NotifyConfigError(f"--commit-status {spec}: give --commit-status-api (gitea)")
    if not token_file:
        raise NotifyConfigError(f"--commit-status {spec}: give --commit-status-token-file")
    token = _read_secret(token_file, "--commit-status-token-file")
    return StatusTarget(
        kind=cast(StatusKind, kind), api=base, repo=repo, token=token, target_url=target_url
    )


def webhook(spec: str, *, secret_file: str | None) -> Webhook:
    """``FORMAT:URL`` or ``FORMAT:@FILE``. Raises NotifyConfigError."""
    form, sep, where = spec.partition(":")
    if not sep or form not in ("json", "slack", "teams") or not where:
        raise NotifyConfigError(
            f"--alert-webhook {spec!r}: expected json:URL, slack:URL or teams:URL (or "
            "FORMAT:@FILE holding the URL)"
        )
    url = _read_secret(where[1:], "--alert-webhook") if where.startswith("@") else where
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise NotifyConfigError(f"--alert-webhook {form}: not an http(s) URL")
    secret = _read_secret(secret_file, "--alert-secret-file").encode() if secret_file else None
    return Webhook(
        format=cast(AlertFormat, form), url=url, secret=secret if form == "json" else None
    )


# --- sending -------------------------------------------------------------------------------------


class Outbox:
    """Sends each request in one thread: once per (key, digest), retried, rate limited."""

    def __init__(
        self,
        *,
        per_minute: int = PER_MINUTE,
        attempts: int = ATTEMPTS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.per_minute = per_minute
        self.attempts = attempts
        self.sleep = sleep
        self.sent: dict[str, str] = {}
        self._queue: deque[tuple[str, str, Request]] = deque()
        self._queued: set[tuple[str, str]] = set()
        self._times: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notify", daemon=True)

    def offer(self, key: str, request: Request) -> None:
        """Send ``request`` unless what it says was sent (or queued) for ``key`` already."""
        digest = hashlib.sha256(request.url.encode() + b"\0" + request.body).hexdigest()
        with self._lock:
            if self.sent.get(key) == digest or (key, digest) in self._queued:
                return
            self._queued.add((key, digest))
            self._queue.append((key, digest, request))
        self._wake.set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def drain(self) -> None:
        """Send everything queued now (in the caller's thread)."""
        while True:
            with self._lock:
                if not self._queue:
                    return
                key, digest, request = self._queue.popleft()
            self._deliver(key, digest, request)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            self.drain()

    def _deliver(self, key: str, digest: str, request: Request) -> None:
        host = urllib.parse.urlsplit(request.url).netloc
        for attempt in range(1, self.attempts + 1):
            self._throttle(host)
            wait = self._send(request)
            if wait is None:
                with self._lock:
                    self.sent[key] = digest
                    self._queued.discard((key, digest))
                return
            if wait < 0 or attempt == self.attempts or self._stop.is_set():
                break
            self.sleep(max(wait, 2.0 ** (attempt - 1)))
        with self._lock:
            self._queued.discard((key, digest))  # offered again at the next look

    def _throttle(self, host: str) -> None:
        times = self._times.setdefault(host, deque())
        now = time.monotonic()
        while times and now - times[0] >= 60:
            times.popleft()
        if len(times) >= self.per_minute:
            self.sleep(60 - (now - times[0]))
        times.append(time.monotonic())

    def _send(self, request: Request) -> float | None:
        """None: delivered; a delay: try again after it; -1: refused for good."""
        http = urllib.request.Request(
            request.url,
            data=request.body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": "fleetlet-hub",
                **request.headers,
            },
        )
        try:
            with urllib.request.urlopen(http, timeout=15) as answer:
                answer.read()
            return None
        except urllib.error.HTTPError as exc:
            if exc.code == 429 or exc.code >= 500:
                after = exc.headers.get("Retry-After", "")
                return min(float(after), 60.0) if after.isdigit() else 0.0
            log.warning(
                "notification to %s refused: %s %s", _where(request.url), exc.code, exc.reason
            )
            return -1
        except (urllib.error.URLError, OSError) as exc:
            log.warning("notification to %s failed: %s", _where(request.url), exc)
            return 0.0


def _where(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"  # never the path: a webhook's path is its secret


# --- the loop in hub serve -----------------------------------------------------------------------


class Notifier:
    """Looks at the rollouts and the status view every ``interval`` and offers what changed."""

    def __init__(
        self,
        *,
        statuses: Sequence[StatusTarget],
        webhooks: Sequence[Webhook],
        rollouts: Callable[[], list[dict[str, Any]]] | None,
        queries: Any,
        moving: Callable[[], Mapping[str, AbstractSet[str]]] | None = None,
        interval: float,
        outbox: Outbox | None = None,
    ) -> None:
        self.statuses = statuses
        self.webhooks = webhooks
        self.rollouts = rollouts
        self.queries = queries
        self.moving = moving
        self.interval = interval
        self.outbox = outbox or Outbox()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notify-look", daemon=True)

    def look(self) -> None:
        """One look: the statuses and alerts of now, offered to the outbox."""
        found = self.rollouts() if self.rollouts is not None else []
        for status in commit_statuses(found):
            for target in self.statuses:
                self.outbox.offer(
                    f"{target.kind}/{status.sha}/{status.context}", target.request(status)
                )
        if not self.webhooks:
            return
        q = self.queries
        pending = []
        for item in q.installations(state="AwaitingApproval")["items"]:
            detail = q.installation(item["cluster"], item["bundle"], admin=False)
            for r in detail.get("requests") or ():
                if r.get("state") == "Pending":
                    pending.append({"cluster": item["cluster"], "request": r})
        unique = {f"{p['cluster']}/{p['request']['name']}": p for p in pending}
        for alert in alerts(
            found,
            q.installations(state="RolledBack")["items"],
            unique.values(),
            q.clusters()["items"],
            self.moving() if self.moving is not None else None,
        ):
            for hook in self.webhooks:
                self.outbox.offer(f"{hook.format}:{hook.url}/{alert.key}", hook.request(alert))

    def start(self) -> None:
        self.outbox.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.outbox.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.look()
            except FleetletError as exc:
                log.warning("notifications: %s", exc)


def notifier_from_args(
    args: argparse.Namespace, *, rollouts: Any, queries: Callable[[], Any]
) -> Notifier | None:
    """The commit statuses and alerts of ``--commit-status`` and ``--alert-webhook`` of
    ``hub serve`` (None: neither given), over its ``rollouts`` (None: none) and the status
    queries ``queries()`` gives. Raises NotifyConfigError, ServeUsageError."""
    from hub.serve import ServeUsageError, parse_duration

    specs = getattr(args, "commit_status", None) or []
    hooks = getattr(args, "alert_webhook", None) or []
    if not specs and not hooks:
        return None
    statuses = [
        status_target(
            spec,
            api=args.commit_status_api,
            token_file=args.commit_status_token_file,
            target_url=args.commit_status_url,
        )
        for spec in specs
    ]
    if statuses and rollouts is None:
        raise ServeUsageError("--commit-status reports rollouts: it needs --fleet")
    return Notifier(
        statuses=statuses,
        webhooks=[webhook(spec, secret_file=args.alert_secret_file) for spec in hooks],
        rollouts=(lambda: rollouts.list()["items"]) if rollouts is not None else None,
        queries=queries(),
        moving=(lambda: _moving(rollouts)) if rollouts is not None else None,
        interval=parse_duration(getattr(args, "refresh", None) or "10s").total_seconds(),
    )


def _moving(rollouts: Any) -> dict[str, set[str]]:
    """Group -> the clusters its active rollout still moves (not final: halted included)."""
    return {r.group: set(r.members) for r in rollouts.state().active() if not r.final}


__all__ = [
    "Alert",
    "CommitStatus",
    "Notifier",
    "NotifyConfigError",
    "Outbox",
    "StatusTarget",
    "Webhook",
    "add_notify_arguments",
    "alerts",
    "commit_statuses",
    "notifier_from_args",
    "status_target",
    "webhook",
]
