"""``fleetlet explain CLUSTER [BUNDLE]`` and ``GET /api/v1/explain/{cluster}``: why a cluster
is not running the latest, in one answer.

The checks, in order; the first that blocks is the answer, the others are the details:

    branch -> agent reported -> refusal -> rollout -> staleness -> approval -> dependsOn
        -> failure -> paused -> moving

- *branch* (when read): a cluster without a branch is in no publication; else the serial its
  branch carries against the one its agent accepted;
- *agent reported*: a cluster that never pushed a status document says nothing else;
- *refusal*: the agent refused the newest publication (signature, serial, expiry...);
- *rollout*: the group's active rollout holds the cluster (its wave not reached, a
  ``pauseBefore`` waiting for a promotion, the rollout paused or halted) or reverted it; the
  rollout state is the hub's, so it is true however old the agent's report is;
- *staleness*: the agent has not reported for longer than ``stale after``: what it said last
  may no longer hold (it is shown all the same);
- *approval*: the group waits for its BundleDeploymentRequest, or the request was denied (by
  whom, why);
- *dependsOn*: the group waits for groups that are not healthy, and why each one is not (its
  own Ready reason and last failed run);
- *failure*: the group's move failed or was rolled back (the failed object, the message,
  when it is tried again: the Ready message says which of the agent's retry rules applies);
- *paused*: the set or a cluster admin paused the bundle.

Everything is read from documents both sources give (the status view's cluster summary and
installation details, :class:`hub.status.queries.StatusQueries`; the rollout state,
:class:`hub.rollout.state.State`), so the hub API and ``--repo`` answer the same. Pure
functions: :func:`explain` returns the document, :func:`lines` its text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agent.errors import FleetletError

if TYPE_CHECKING:
    # The rollout state and the status queries (with the fleet loader and git: about 300 ms)
    # are the server's and ``--repo``'s: ``fleetlet explain --hub`` prints with :func:`lines`.
    from hub.rollout.state import Rollout, State
    from hub.status.queries import StatusQueries

Check = Literal[
    "agent", "publication", "rollout", "stale", "approval", "dependency", "failure", "paused"
]
_WAITING = re.compile(r"waiting for group\(s\) (?P<groups>.+?) to be healthy")


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing found about the cluster: ``blocking`` if it keeps the latest away."""

    check: Check | Literal["ok", "moving"]
    summary: str
    bundle: str | None = None
    blocking: bool = True
    details: tuple[str, ...] = ()
    unblock: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "blocking": self.blocking,
            "summary": self.summary,
            **({"bundle": self.bundle} if self.bundle else {}),
            **({"details": list(self.details)} if self.details else {}),
            **({"unblock": self.unblock} if self.unblock else {}),
        }


def gather(
    queries: StatusQueries, cluster: str, bundle: str | None
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The cluster's summary (None: it never reported) and its installations' details (only
    ``bundle``'s when given). Raises QueryError (404) for a bundle the cluster does not
    report."""
    from hub.status.queries import QueryError

    try:
        summary = queries.cluster(cluster)
    except QueryError:
        return None, []
    names = [i["bundle"] for i in queries.installations(cluster=cluster)["items"]]
    if bundle is not None and bundle not in names:
        raise QueryError(404, f"cluster {cluster!r} reports no bundle {bundle!r}")
    details = [queries.installation(cluster, n, admin=False) for n in names]
    return summary, details


def answer(
    queries: StatusQueries,
    cluster: str,
    bundle: str | None,
    rollouts: Callable[[], State] | None,
    published: Callable[[str], Published | None] | None = None,
) -> dict[str, Any]:
    """:func:`explain` over a status view, a rollout state reader and a reader of the
    cluster's branch (each None: not read), what the API and ``--repo`` both answer. Raises
    QueryError (404: a bundle not reported, a cluster known nowhere)."""
    from hub.status.queries import QueryError

    summary, details = gather(queries, cluster, bundle)
    active, notes = None, []
    if rollouts is not None:
        try:
            active = rollouts().active()
        except FleetletError as exc:
            notes.append(f"rollouts not read: {exc}")
    branch: Published | Literal[False] | None = False
    if published is not None:
        try:
            branch = published(cluster)
        except FleetletError as exc:
            notes.append(f"cluster branch not read: {exc}")
    known = (
        cluster in queries.labels or any(cluster in r.members for r in active or ()) or bool(branch)
    )
    if summary is None and not known:
        raise QueryError(
            404,
            f"unknown cluster {cluster!r}: it never reported and is in no rollout (nor in the "
            "fleet, when the hub reads one)",
        )
    found = explain(
        cluster,
        bundle,
        summary=summary,
        installations=details,
        rollouts=active,
        published=branch,
    )
    return {**found, **({"notes": notes} if notes else {})}


def explain(
    cluster: str,
    bundle: str | None,
    *,
    summary: Mapping[str, Any] | None,
    installations: Sequence[Mapping[str, Any]],
    rollouts: Iterable[Rollout] | None,
    published: Published | Literal[False] | None = False,
) -> dict[str, Any]:
    """The answer for ``cluster`` (``bundle``: only that bundle and its group), as a document:
    ``blocked``, the first blocking ``reason`` (None: nothing blocks) and every ``finding``.
    ``rollouts``: the active rollouts (None: the rollout state was not read); ``published``:
    what the cluster's branch carries (None: no branch; False: not read)."""
    by_bundle = {str(i["bundle"]): i for i in installations}
    groups = {str(i.get("group") or i["bundle"]) for i in installations}
    wanted = [by_bundle[bundle]] if bundle is not None and bundle in by_bundle else installations
    if bundle is not None:
        groups = {str(w.get("group") or w["bundle"]) for w in wanted}
    found: list[Finding] = []
    if published is not False:
        found += _branch(cluster, published, summary)
    if summary is None:
        found.append(
            Finding(
                check="agent",
                summary=f"cluster {cluster} has never reported: no status document on "
                f"fleetlet/status/{cluster}",
                details=(
                    "its agent is not installed, not running, or cannot push to the status "
                    "repository (see its logs: kubectl -n fleetlet-system logs deploy/fleetlet-agent)",
                ),
                unblock=f"fleetlet agent install --cluster {cluster} ...",
            )
        )
    if summary is not None:
        found += _publication(summary)
    found += _rollouts(cluster, groups, rollouts)
    if summary is not None:
        found += _stale(summary)
        for item in wanted:
            found += _installation(cluster, item, by_bundle)
    blocking = [f for f in found if f.blocking]
    if not blocking and summary is not None:
        moving = [f for f in found if f.check == "moving"]
        if not moving:
            accepted = summary.get("lastAcceptedSerial")
            found.append(
                Finding(
                    check="ok",
                    blocking=False,
                    summary=f"nothing blocks: {_what(bundle, len(wanted))} Ready on the "
                    f"latest serial the agent accepted ({accepted})",
                )
            )
    first = blocking[0] if blocking else None
    return {
        "cluster": cluster,
        "bundle": bundle,
        "blocked": first is not None,
        "reason": first.to_dict() if first is not None else None,
        "findings": [f.to_dict() for f in found],
        "rolloutsRead": rollouts is not None,
        "branchRead": published is not False,
        **({"publishedSerial": published.serial} if published else {}),
    }


@dataclass(frozen=True, slots=True)
class Published:
    """What the cluster's branch carries: the newest publication for it."""

    serial: int
    expires_at: str
    repo: str


def _branch(
    cluster: str, published: Published | None, summary: Mapping[str, Any] | None
) -> list[Finding]:
    if published is None:
        return [
            Finding(
                check="publication",
                summary=f"cluster {cluster} is in no publication: no branch "
                f"fleetlet/clusters/{cluster}",
                details=(
                    "a cluster gets a branch when hub publish finds it in the fleet's "
                    "inventory with a bundle targeting it (a new cluster: publish again)",
                ),
                unblock="add it to clusters/ in the fleet repo, or target it, then "
                "fleetlet hub publish",
            )
        ]
    accepted = summary.get("lastAcceptedSerial") if summary is not None else None
    where = f"its branch in {published.repo} carries serial {published.serial}"
    if isinstance(accepted, int) and accepted >= published.serial:
        text = f"{where}, which the agent accepted"
    else:
        text = f"{where}; the agent accepted {accepted if accepted is not None else 'none'} (it takes the new one at its next poll)"
    return [
        Finding(
            check="publication",
            blocking=False,
            summary=text,
            details=(f"valid until {published.expires_at}",) if published.expires_at else (),
        )
    ]


def _what(bundle: str | None, count: int) -> str:
    return f"bundle {bundle} is" if bundle else f"all {count} bundles are"


def _publication(summary: Mapping[str, Any]) -> list[Finding]:
    refusal = summary.get("lastRefusal")
    accepted = summary.get("lastAcceptedSerial")
    if not isinstance(refusal, Mapping):
        return []
    serial = refusal.get("serial")
    if isinstance(serial, int) and isinstance(accepted, int) and serial <= accepted:
        return []  # an older refusal, overtaken by an accepted publication
    return [
        Finding(
            check="publication",
            summary=f"the agent refused the newest publication: {refusal.get('reason')}: "
            f"{refusal.get('message', '')}".rstrip(": "),
            details=(
                f"it runs serial {accepted}, the last it accepted",
                f"refused at {refusal.get('at')}"
                + (f" (commit {refusal.get('commit')})" if refusal.get("commit") else ""),
            ),
            unblock="fix what the refusal names (signing identity, trust, expiry), then "
            "fleetlet hub publish again",
        )
    ]


def _rollouts(cluster: str, groups: set[str], rollouts: Iterable[Rollout] | None) -> list[Finding]:
    out: list[Finding] = []
    for rollout in rollouts or ():
        member = rollout.members.get(cluster)
        if member is None or rollout.group not in groups or rollout.final:
            continue
        wave = rollout.waves[member.wave]
        position = f"wave {wave.name} ({member.wave + 1} of {len(rollout.waves)})"
        current = rollout.current_wave()
        at = rollout.waves[current].name if current >= 0 else "none started"
        details = [
            f"rollout {rollout.id}: {rollout.status}, at wave {at}; this cluster is in {position}",
            f"created by {rollout.created_by} at {rollout.created_at} from commit "
            f"{rollout.source_commit[:12]}",
        ]
        if rollout.halt is not None:
            details.append(f"halted at {rollout.halt.at}: {rollout.halt.reason}")
            details += [f"failed: {c}: {why}" for c, why in sorted(rollout.halt.failures.items())]
        if member.phase in ("reverting", "reverted"):
            out.append(
                Finding(
                    check="rollout",
                    summary=f"rollout {rollout.id} of group {rollout.group} reverted this "
                    "cluster to the previous revision",
                    details=tuple(details),
                    unblock="fix the revision and publish again (a new rollout)",
                )
            )
            continue
        if member.phase != "held":
            out.append(
                Finding(
                    check="rollout",
                    blocking=False,
                    summary=f"rollout {rollout.id} of group {rollout.group} released the new "
                    f"revision to this cluster in {position} (serial {member.serial or '-'})",
                    details=tuple(details),
                )
            )
            continue
        rid = rollout.id
        if rollout.status == "Halted":
            summary = f"rollout {rid} of group {rollout.group} is halted before {position}"
            unblock = f"fleetlet hub rollout resume {rid} (or abort {rid})"
        elif rollout.status == "Paused":
            by = next((e.by for e in reversed(rollout.events) if e.action == "paused"), "?")
            summary = (
                f"rollout {rid} of group {rollout.group} is paused (by {by}) before {position}"
            )
            unblock = f"fleetlet hub rollout resume {rid}"
        elif wave.pause_before and member.wave == current + 1 and not wave.promoted_by:
            summary = (
                f"rollout {rid} of group {rollout.group}: {position} waits for a promotion "
                "(pauseBefore)"
            )
            unblock = f"fleetlet hub rollout promote {rid}"
        else:
            summary = (
                f"rollout {rid} of group {rollout.group}: {position} not reached yet (the "
                f"rollout is at wave {at})"
            )
            unblock = (
                f"wait for wave {at} to settle and soak, or fleetlet hub rollout promote {rid}"
            )
        out.append(
            Finding(check="rollout", summary=summary, details=tuple(details), unblock=unblock)
        )
    return out


def _stale(summary: Mapping[str, Any]) -> list[Finding]:
    if not summary.get("stale"):
        return []
    age = summary.get("heartbeatAgeSeconds")
    return [
        Finding(
            check="stale",
            summary=f"the agent has not reported for {_age(age)} (stale): what follows is "
            "what it said last",
            details=(
                f"last heartbeat {summary.get('heartbeat')}, agent {summary.get('agentVersion')}",
            ),
            unblock="check the agent (kubectl -n fleetlet-system get pods; its logs) and its "
            "access to the git server",
        )
    ]


def _age(seconds: Any) -> str:
    if not isinstance(seconds, int | float):
        return "an unknown time"
    minutes = int(seconds // 60)
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes // 60} h" if minutes < 48 * 60 else f"{minutes // 1440} days"


def _ready(item: Mapping[str, Any]) -> Mapping[str, Any]:
    for c in item.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return c
    return {}


def _last_failure(item: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for run in item.get("runs") or ():
        if isinstance(run, Mapping) and run.get("result") in ("Failed", "RolledBack"):
            return run
    return None


def _installation(
    cluster: str, item: Mapping[str, Any], by_bundle: Mapping[str, Mapping[str, Any]]
) -> list[Finding]:
    bundle = str(item["bundle"])
    group = str(item.get("group") or bundle)
    state = item.get("state")
    ready = _ready(item)
    reason, message = ready.get("reason"), str(ready.get("message") or "")
    requests = [r for r in item.get("requests") or () if isinstance(r, Mapping)]
    if state == "AwaitingApproval" or reason == "AwaitingApproval":
        pending = [r for r in requests if r.get("state") == "Pending"]
        request = pending[0] if pending else None
        name = request.get("name") if request else "(not reported)"
        details = [message] if message else []
        if request is not None:
            preview = request.get("preview") or {}
            details.append(
                f"request {name}: serial {request.get('serial')}, bundles "
                f"{', '.join(request.get('bundles') or ())}; preview: "
                f"{preview.get('created', 0)} created, {preview.get('changed', 0)} changed, "
                f"{preview.get('deleted', 0)} deleted, {preview.get('findings', 0)} security "
                "finding(s)"
            )
        return [
            Finding(
                check="approval",
                bundle=bundle,
                summary=f"group {group} waits for approval: request {name}",
                details=tuple(details),
                unblock=f"fleetlet preview {name}, then fleetlet approve {name} "
                f"(with cluster {cluster}'s kubeconfig)",
            )
        ]
    if state == "Denied" or reason == "Denied":
        denied = [r for r in requests if r.get("state") == "Denied"]
        request = denied[0] if denied else {}
        who = request.get("decidedBy") or "?"
        why = request.get("reason") or message or "no reason given"
        return [
            Finding(
                check="approval",
                bundle=bundle,
                summary=f"group {group}'s move was denied by {who}: {why}",
                details=(
                    f"request {request.get('name')}, serial {request.get('serial')}, at "
                    f"{request.get('decidedAt')}",
                )
                if request
                else (),
                unblock="publish a new revision: a denied move waits for a newer serial",
            )
        ]
    if reason == "WaitingForDependency":
        match = _WAITING.search(message)
        waits = [g.strip() for g in match.group("groups").split(",")] if match else []
        details = []
        for dep in waits:
            members = [i for i in by_bundle.values() if (i.get("group") or i["bundle"]) == dep]
            if not members:
                details.append(f"group {dep}: not reported by the agent (not in its set?)")
            for m in members:
                dep_ready = _ready(m)
                failed = _last_failure(m)
                line = (
                    f"group {dep}: bundle {m['bundle']} is {m.get('state')}: "
                    f"{dep_ready.get('reason')}: {dep_ready.get('message') or ''}"
                ).rstrip(": ")
                if failed is not None:
                    line += f"; last failed run {failed.get('id')}: {failed.get('message')}" + (
                        f" ({failed.get('failedObject')})" if failed.get("failedObject") else ""
                    )
                details.append(line)
        first = next(
            (i for i in by_bundle.values() if (i.get("group") or i["bundle"]) in waits), None
        )
        unhealthy = f" (bundle {first['bundle']} is {first.get('state')})" if first else ""
        return [
            Finding(
                check="dependency",
                bundle=bundle,
                summary=f"group {group} waits for group(s) {', '.join(waits) or '?'} to be "
                f"healthy{unhealthy}",
                details=tuple(details),
                unblock=f"fleetlet explain {cluster} {first['bundle']}" if first else None,
            )
        ]
    if state in ("Degraded", "RolledBack"):
        failed = _last_failure(item)
        details = [f"Ready: {reason}: {message}".rstrip(": ")]
        if failed is not None:
            details.append(
                f"run {failed.get('id')} ({failed.get('operation')}, serial "
                f"{failed.get('serial')}) {failed.get('result')} at {failed.get('finishedAt')}: "
                f"{failed.get('message')}"
                + (f" ({failed.get('failedObject')})" if failed.get("failedObject") else "")
            )
        details.append(
            "tried again on a newer serial, on a new fleetlet.io/retry annotation, or by itself "
            "after --retry-backoff when the cluster caused it (the Ready message says which)"
        )
        what = "was rolled back" if state == "RolledBack" else "failed"
        return [
            Finding(
                check="failure",
                bundle=bundle,
                summary=f"group {group}'s move {what}: {reason}"
                + (
                    f" ({failed.get('failedObject')})"
                    if failed and failed.get("failedObject")
                    else ""
                ),
                details=tuple(details),
                unblock=f"fix it and publish, or retry: kubectl annotate bundledeployment "
                f"{bundle} fleetlet.io/retry=$(date +%s) --overwrite (on cluster {cluster})",
            )
        ]
    if state == "Paused":
        return [
            Finding(
                check="paused",
                bundle=bundle,
                summary=f"bundle {bundle} is paused: nothing is applied, drift is only reported",
                details=(message,) if message else (),
                unblock="remove paused: true from the bundle (or its override) and publish, or "
                f"kubectl annotate bundledeployment {bundle} fleetlet.io/paused- (on cluster "
                f"{cluster})",
            )
        ]
    if state == "Progressing":
        return [
            Finding(
                check="moving",
                bundle=bundle,
                blocking=False,
                summary=f"bundle {bundle} is moving to serial "
                f"{item.get('appliedSerial') or '?'}: {reason}: {message}".rstrip(": "),
            )
        ]
    return []


def lines(answer: Mapping[str, Any]) -> list[str]:
    """The answer as text: the first blocking reason in one line, the details beneath."""
    reason = answer.get("reason")
    out: list[str] = []
    if reason is None:
        ok = next(
            (f for f in answer["findings"] if f["check"] in ("ok", "moving")),
            {"summary": "nothing blocks"},
        )
        out.append(str(ok["summary"]))
    else:
        out.append(str(reason["summary"]))
        out += [f"  {d}" for d in reason.get("details", [])]
        if reason.get("unblock"):
            out.append(f"  to unblock: {reason['unblock']}")
    others = [f for f in answer["findings"] if f != reason and f["check"] != "ok"]
    if others:
        out += ["", "Also:"]
        for f in others:
            mark = "blocks" if f["blocking"] else "info"
            out.append(f"  [{mark}] {f['summary']}")
    if not answer.get("branchRead"):
        out += ["", "(the cluster's branch not read: give --cluster-repo with --repo)"]
    if not answer.get("rolloutsRead"):
        out += [
            "",
            "(rollouts not read: give --cluster-repo with --repo, or ask a hub started with --fleet)",
        ]
    return out


__all__ = ["Finding", "Published", "answer", "explain", "gather", "lines"]
